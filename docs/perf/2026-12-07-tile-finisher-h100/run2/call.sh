#!/usr/bin/env bash
# The pack holds g28 = 08a4106 (main before), g32 = the tile finisher with its loads of all runs
# issued together (47d137b), and g33 = g32 with the tiled FP8 linears only from 4096 columns (the
# shared expert's w1 and w3 on the decode kernel; 4b09070).
# 1. g33: linear_gpu_test, act_quant_fp8_gpu_test, moe_fp4_gpu_test (+ memcheck of the linear sanitizer
#    cases), the golden tests; g32: linear_gpu_test and golden_gpu_test;
# 2. bench-ops linear (wo_a) for g32 and g28;
# 3. decode steps of g32, g33 and g28 alternated. The flash outputs are packed in one file, the checks too.
set -u
cd "$(dirname "$0")/.."
R=$OUT/r; rm -rf $R; mkdir -p $R/flash $R/check
T0=$SECONDS
tar xJf PACKS/g33.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
echo "g28 $(cat g28/COMMIT); g32 $(cat g32/COMMIT); g33 $(cat g33/COMMIT)" >> $R/gpu.txt; cat $R/gpu.txt
export LD_LIBRARY_PATH=$PWD/g33/lib
P="profile --model synthetic:flash,layers=4 --backend cuda"
prof() {  # bin name args...
  local b=$1 n=$2; shift 2
  { echo "\`$b/dsv4 $P $*\`"; echo; } > $R/flash/$n.md
  timeout 40 $b/dsv4 $P "$@" >> $R/flash/$n.md 2>> $R/flash/$n.log
  echo "$n: $(grep -hE 'replayed step \(' $R/flash/$n.md | cut -c1-100 | tr '\n' ' ') t=$((SECONDS - T0))"
}
check() {  # bin test [args]
  local b=$1 t=$2; shift 2
  timeout 150 $b/$t "$@" > $R/check/${b}_$t.log 2>&1; echo "$b $t rc=$? t=$((SECONDS - T0))"
  grep -E "^\[  FAILED|^\[  PASSED|Failure" $R/check/${b}_$t.log | head -6
}
for t in linear_gpu_test act_quant_fp8_gpu_test moe_fp4_gpu_test; do check g33 $t; done
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 g33/linear_gpu_test --gtest_filter='*Sanitizer*' > $R/check/g33_linear_memcheck.log 2>&1
echo "memcheck rc=$? t=$((SECONDS - T0))"; tail -n 1 $R/check/g33_linear_memcheck.log
check g32 linear_gpu_test
export DSV4_BINARY="$PWD/g33/dsv4" DSV4_TEST_DATA="$PWD/tests/data" DSV4_TEST_TMP="/tmp/gt"
for t in golden_gpu_test golden_tp_gpu_test; do check g33 $t; done
DSV4_BINARY="$PWD/g32/dsv4" check g32 golden_gpu_test
for g in g32 g28; do
  DSV4_LINEAR_BENCH_SHAPES=wo_a DSV4_LINEAR_BENCH_ROWS=1,8,16,32,64 timeout 60 $g/dsv4 bench-ops linear > $R/bench_linear_$g.md 2> $R/bench_linear_$g.log
  echo "bench $g rc=$? t=$((SECONDS - T0))"; grep -E "^\| [0-9]" $R/bench_linear_$g.md | cut -c1-200 | tail -5
done
for b in 1 64 32 16 1 64 32 16 1; do
  [ $((SECONDS - T0)) -lt 420 ] || break
  for g in g32 g33 g28; do prof $g ${g}_b${b}_$((SECONDS % 100)) --context 4096 --steps 20 --batch-size $b; done
done
[ $((SECONDS - T0)) -lt 440 ] && prof g32 g32_prefill --prefill 8192 --steps 3
[ $((SECONDS - T0)) -lt 460 ] && prof g33 g33_prefill --prefill 8192 --steps 3
echo "t=$((SECONDS - T0))"
(cd $R && tar czf flash.tgz flash check && rm -rf flash check)
