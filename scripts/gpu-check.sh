#!/usr/bin/env bash
# Runs on a machine with an NVIDIA GPU: every GPU test, compute-sanitizer memcheck on the small
# cases, and the op benchmarks; prints a summary table last. Full logs go to $GPU_CHECK_OUT
# (default ./gpu-out).
# Usage: scripts/gpu-check.sh [BIN_DIR] [bench ops...]
#   BIN_DIR   executables from scripts/gpu-build.sh (default gpu-bin); when it does not exist the
#             script builds them first (needs cmake, nvcc and the Debian -dev packages).
#   bench ops default: moe attention indexer ("none" skips benchmarks)
# Every step runs under a time limit (DSV4_TEST_TIMEOUT, default 180 s; DSV4_BENCH_TIMEOUT, 240 s),
# so a hung kernel costs one step, not the whole run; exit status 124 marks a timeout.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:-gpu-bin}
shift || true
ops=("$@")
[ ${#ops[@]} -eq 0 ] && ops=(moe attention indexer)
out=${GPU_CHECK_OUT:-gpu-out}
mkdir -p "$out"
if [ ! -x "$bin/dsv4" ]; then
  scripts/gpu-build.sh || { echo "build failed"; exit 1; }
  bin=gpu-bin
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv | tee "$out/gpu.txt"
if [ -f "$bin/COMMIT" ]; then commit=$(cat "$bin/COMMIT"); else commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"; fi
echo "binaries built from commit $commit" | tee -a "$out/gpu.txt"
summary=()
for t in "$bin"/*_gpu_test; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  start=$SECONDS
  timeout "${DSV4_TEST_TIMEOUT:-180}" "$t" >"$out/$name.log" 2>&1
  rc=$?
  secs=$((SECONDS - start))
  summary+=("| $name | $( [ $rc = 0 ] && echo PASS || echo "FAIL ($rc)") | ${secs}s |")
  tail -n 3 "$out/$name.log"
  if command -v compute-sanitizer >/dev/null; then
    timeout "${DSV4_TEST_TIMEOUT:-180}" compute-sanitizer --tool memcheck --error-exitcode 9 "$t" --gtest_filter='*Sanitizer*' >"$out/$name.memcheck.log" 2>&1
    rc=$?
    summary+=("| $name memcheck | $( [ $rc = 0 ] && echo CLEAN || echo "ERRORS ($rc)") | |")
  fi
done
for op in "${ops[@]}"; do
  [ "$op" = none ] && continue
  timeout "${DSV4_BENCH_TIMEOUT:-240}" "$bin/dsv4" bench-ops "$op" 2>&1 | tee "$out/bench_$op.md"
  summary+=("| bench-ops $op | rc ${PIPESTATUS[0]} | |")
done
echo
echo "| check | result | time |"
echo "|---|---|---|"
printf '%s\n' "${summary[@]}"
