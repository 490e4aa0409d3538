#!/usr/bin/env bash
# The pack holds g23 = 1510b12 (main; dsv4 + lib) and g27 = ac4c1bb (the branch wo-a-fp8 as it lands):
# wo_a on the tiled FP8-weight kernel at every decode row count (a 16-row tile with 7 stages
# up to 16 rows), the FP8 linears on it at 32-127 rows ahead of cuBLASLt. The flash outputs are packed in one file.
# 1. g27: linear_gpu_test (+ memcheck of its sanitizer cases), bench-ops linear (wo_a), the golden tests;
# 2. g27 and g23 decode steps alternated (batch 1 and 64 twice), then the prefills (g27 twice). Results go to $OUT.
set -u
cd "$(dirname "$0")/.."
R=$OUT/r; rm -rf $R; mkdir -p $R/flash $R/check
T0=$SECONDS
tar xJf PACKS/g27.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
echo "g23 $(cat g23/COMMIT); g27 $(cat g27/COMMIT)" >> $R/gpu.txt; cat $R/gpu.txt
export LD_LIBRARY_PATH=$PWD/g23/lib
P="profile --model synthetic:flash,layers=4 --backend cuda"
prof() {  # bin name args...
  local b=$1 n=$2; shift 2
  { echo "\`$b/dsv4 $P $*\`"; echo; } > $R/flash/$n.md
  timeout 40 $b/dsv4 $P "$@" >> $R/flash/$n.md 2>> $R/flash/$n.log
  echo "$n: $(grep -hE 'replayed step \(|model TFLOP/s' $R/flash/$n.md | cut -c1-110 | tr '\n' ' ') t=$((SECONDS - T0))"
  grep -hE '^\| (grouped_out_proj|linear_fp8|wo_a)' $R/flash/$n.md | head -3 | cut -c1-160
}
timeout 150 g27/linear_gpu_test > $R/check/linear_gpu_test.log 2>&1; echo "linear_gpu_test rc=$? t=$((SECONDS - T0))"
grep -E "^\[  FAILED|^\[  PASSED|Failure" $R/check/linear_gpu_test.log | head -12
grep -E "fp8 |tiled" $R/check/linear_gpu_test.log | cut -c1-190 | head -16
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 g27/linear_gpu_test --gtest_filter='*Sanitizer*' > $R/check/linear_memcheck.log 2>&1
echo "memcheck rc=$? t=$((SECONDS - T0))"; tail -n 2 $R/check/linear_memcheck.log
DSV4_LINEAR_BENCH_SHAPES=wo_a DSV4_LINEAR_BENCH_ROWS=1,8,16,32,64,128,512 timeout 100 g27/dsv4 bench-ops linear > $R/bench_linear.md 2> $R/bench_linear.log
echo "bench rc=$? t=$((SECONDS - T0))"; grep -E "^\||copy" $R/bench_linear.md | cut -c1-230 | head -60
export DSV4_BINARY="$PWD/g27/dsv4" DSV4_TEST_DATA="$PWD/tests/data" DSV4_TEST_TMP="/tmp/gt"
for t in golden_gpu_test golden_tp_gpu_test; do
  timeout 100 g27/$t > $R/check/$t.log 2>&1; echo "$t rc=$? t=$((SECONDS - T0))"; tail -n 3 $R/check/$t.log
done
for b in 1 16 64 1 64; do
  [ $((SECONDS - T0)) -lt 520 ] || break
  prof g27 g27_b${b}_$((SECONDS % 100)) --context 4096 --steps 20 --batch-size $b
  prof g23 g23_b${b}_$((SECONDS % 100)) --context 4096 --steps 20 --batch-size $b
done
[ $((SECONDS - T0)) -lt 540 ] && prof g27 g27_prefill --prefill 8192 --steps 3
[ $((SECONDS - T0)) -lt 560 ] && prof g23 g23_prefill --prefill 8192 --steps 3
[ $((SECONDS - T0)) -lt 570 ] && prof g27 g27_prefill_b --prefill 8192 --steps 3
echo "t=$((SECONDS - T0))"
(cd $R && tar czf flash.tgz flash && rm -rf flash)
