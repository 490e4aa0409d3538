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
export LD_LIBRARY_PATH="$PWD/$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # gpu-build.sh's copies of -dev libraries
source scripts/nccl-env.sh  # the split-model tests' NCCL
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv | tee "$out/gpu.txt"
if [ -f "$bin/COMMIT" ]; then commit=$(cat "$bin/COMMIT"); else commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"; fi
echo "binaries built from commit $commit" | tee -a "$out/gpu.txt"
echo "NCCL: ${DSV4_NCCL_LIBRARY:-from the loader path}" | tee -a "$out/gpu.txt"
summary=()
# PASS, FAIL (rc), SKIPPED (rc 77: no GPU, or every case skipped), or PASS with the number of cases
# gtest skipped ("[  SKIPPED ] N tests, listed below:"), so that a skip never reads as a pass.
result_of() {  # rc log
  local skipped
  skipped=$(grep -oE '^\[  SKIPPED \] [0-9]+ tests?, listed below' "$2" | grep -oE '[0-9]+' | head -n 1)
  if [ "$1" = 77 ]; then echo "SKIPPED"
  elif [ "$1" != 0 ]; then echo "FAIL ($1)"
  elif [ -n "$skipped" ]; then echo "PASS, $skipped SKIPPED"
  else echo "PASS"; fi
}
# The golden test runs the dsv4 binary and reads the fixtures from this tree, wherever it is.
export DSV4_BINARY="$PWD/$bin/dsv4" DSV4_TEST_DATA="$PWD/tests/data" DSV4_TEST_TMP="$PWD/$out/tmp"
for t in "$bin"/*_gpu_test; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  start=$SECONDS
  timeout "${DSV4_TEST_TIMEOUT:-180}" "$t" >"$out/$name.log" 2>&1
  rc=$?
  secs=$((SECONDS - start))
  summary+=("| $name | $(result_of "$rc" "$out/$name.log") | ${secs}s |")
  tail -n 3 "$out/$name.log"
  if command -v compute-sanitizer >/dev/null; then
    timeout "${DSV4_TEST_TIMEOUT:-180}" compute-sanitizer --tool memcheck --error-exitcode 9 "$t" --gtest_filter='*Sanitizer*' >"$out/$name.memcheck.log" 2>&1
    rc=$?
    case $rc in
      0) memcheck=CLEAN ;;
      77) memcheck=SKIPPED ;;
      *) memcheck="ERRORS ($rc)" ;;
    esac
    summary+=("| $name memcheck | $memcheck | |")
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
