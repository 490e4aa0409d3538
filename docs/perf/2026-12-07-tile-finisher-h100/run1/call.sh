#!/usr/bin/env bash
# The pack holds g28 = 08a4106 (main before; dsv4 + tests), g30 = the tile finisher (its COMMIT):
# linear_fp8w_mma's last block per tile adds the K runs and, for grouped_out_proj at decode rows,
# writes wo_b's FP8 codes; quantised rows carry the bf16 values the tiled linears take; and g31 =
# g30 with the tiled FP8 linears only from 4096 columns (dsv4 only).
# 1. g30: linear_gpu_test, act_quant_fp8_gpu_test (+ memcheck of the linear sanitizer cases), the golden tests;
# 2. bench-ops linear (wo_a) for g30 and g28;
# 3. g30 and g28 decode steps alternated, g31 beside them at batch 32 and 64. The flash outputs are packed in one file.
set -u
cd "$(dirname "$0")/.."
R=$OUT/r; rm -rf $R; mkdir -p $R/flash $R/check
T0=$SECONDS
tar xJf PACKS/g31.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
echo "g28 $(cat g28/COMMIT); g30 $(cat g30/COMMIT); g31 $(cat g31/COMMIT)" >> $R/gpu.txt; cat $R/gpu.txt
export LD_LIBRARY_PATH=$PWD/g30/lib
P="profile --model synthetic:flash,layers=4 --backend cuda"
prof() {  # bin name args...
  local b=$1 n=$2; shift 2
  { echo "\`$b/dsv4 $P $*\`"; echo; } > $R/flash/$n.md
  timeout 40 $b/dsv4 $P "$@" >> $R/flash/$n.md 2>> $R/flash/$n.log
  echo "$n: $(grep -hE 'replayed step \(|model TFLOP/s' $R/flash/$n.md | cut -c1-110 | tr '\n' ' ') t=$((SECONDS - T0))"
  grep -hE '^\| (grouped_out_proj|linears? attn.(wq_b|wo_b)) \| (SWA)' $R/flash/$n.md | head -3 | cut -c1-110
}
for t in linear_gpu_test act_quant_fp8_gpu_test; do
  timeout 150 g30/$t > $R/check/$t.log 2>&1; echo "$t rc=$? t=$((SECONDS - T0))"
  grep -E "^\[  FAILED|^\[  PASSED|Failure|Expected|Which is" $R/check/$t.log | head -12
done
grep -E "with codes|after" $R/check/linear_gpu_test.log | head -8
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 g30/linear_gpu_test --gtest_filter='*Sanitizer*' > $R/check/linear_memcheck.log 2>&1
echo "memcheck rc=$? t=$((SECONDS - T0))"; tail -n 2 $R/check/linear_memcheck.log
export DSV4_BINARY="$PWD/g30/dsv4" DSV4_TEST_DATA="$PWD/tests/data" DSV4_TEST_TMP="/tmp/gt"
for t in golden_gpu_test golden_tp_gpu_test; do
  timeout 100 g30/$t > $R/check/$t.log 2>&1; echo "$t rc=$? t=$((SECONDS - T0))"; tail -n 3 $R/check/$t.log
done
for g in g30 g28; do
  DSV4_LINEAR_BENCH_SHAPES=wo_a DSV4_LINEAR_BENCH_ROWS=1,8,16,32,64 timeout 60 $g/dsv4 bench-ops linear > $R/bench_linear_$g.md 2> $R/bench_linear_$g.log
  echo "bench $g rc=$? t=$((SECONDS - T0))"; grep -E "^\| [0-9]" $R/bench_linear_$g.md | cut -c1-200 | tail -5
done
for b in 1 64 32 16 1 64 32; do
  [ $((SECONDS - T0)) -lt 470 ] || break
  prof g30 g30_b${b}_$((SECONDS % 100)) --context 4096 --steps 20 --batch-size $b
  prof g28 g28_b${b}_$((SECONDS % 100)) --context 4096 --steps 20 --batch-size $b
  [ $b -ge 32 ] && prof g31 g31_b${b}_$((SECONDS % 100)) --context 4096 --steps 20 --batch-size $b
done
echo "t=$((SECONDS - T0))"
(cd $R && tar czf flash.tgz flash && rm -rf flash)
