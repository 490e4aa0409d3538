#!/usr/bin/env bash
# Nsight Compute profile of one kernel of an op benchmark: the details page (speed of light, warp
# states, memory tables, occupancy) and the per-SASS-instruction source page (stall samples) as CSV.
# Usage: [ENV=... ] scripts/gpu-profile.sh NAME KERNEL_REGEX BENCH_OP [LAUNCH_COUNT]
#   e.g. DSV4_ATTN_BENCH_SHAPES=128x2 DSV4_ATTN_BENCH_VARIANTS=separate \
#        scripts/gpu-profile.sh attn128 sparse_mla_decode_kernel attention
# Output: $GPU_CHECK_OUT/NAME.details.txt and NAME.sass.csv (default folder gpu-out). The clocks are
# left as they are (--clock-control none), like the benchmarks run. NCU_ARGS adds ncu options (e.g.
# --warp-sampling-interval 0 for short kernels on few SMs).
set -uo pipefail
cd "$(dirname "$0")/.."
name=$1 kernel=$2 op=$3 count=${4:-1}
bin=${GPU_BIN:-gpu-bin}
out=${GPU_CHECK_OUT:-gpu-out}
mkdir -p "$out"
ncu --clock-control none --kernel-name "regex:$kernel" --launch-count "$count" --set full --import-source no ${NCU_ARGS:-} \
  -f -o "$out/$name" "$bin/dsv4" bench-ops "$op" >"$out/$name.run.log" 2>&1 || { tail -20 "$out/$name.run.log"; exit 1; }
ncu -i "$out/$name.ncu-rep" --page details >"$out/$name.details.txt" 2>&1
ncu -i "$out/$name.ncu-rep" --page source --csv --print-source sass >"$out/$name.sass.csv" 2>&1
rm -f "$out/$name.ncu-rep"
echo "$name: $(wc -l <"$out/$name.sass.csv") SASS lines"
