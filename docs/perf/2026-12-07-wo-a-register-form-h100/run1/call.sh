#!/usr/bin/env bash
# gA = main (the baseline), gB = main + wo_a's register form, gC = gB + the MoE down GEMM's early
# L2 requests (their COMMIT files).
# 1. gB: the linear tests that reach linear_fp8w_mma, memcheck of the sanitizer cases; gC: the MoE
#    tests; the golden tests through gC's dsv4; bench-ops linear on wo_a (gA, gB), bench-ops moe (gB, gC);
# 2. decode steps alternated gA / gB / gC at batch 1, 8, 16, 64, a traced batch-1 replay of each;
# 3. outputs packed in flash.tgz.
set -u
cd "$(dirname "$0")/.."
R=$OUT/r; rm -rf $R; mkdir -p $R/flash $R/check
T0=$SECONDS
LIMIT=${LIMIT:-400}  # the seconds this call may take: the profiles stop in time to pack the outputs
for p in PACKS/g*.tar.xz; do tar xJf $p; done
cp -r gB/lib gC/ 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
echo "gA $(cat gA/COMMIT); gB $(cat gB/COMMIT); gC $(cat gC/COMMIT)" >> $R/gpu.txt; cat $R/gpu.txt
export LD_LIBRARY_PATH=$PWD/gB/lib
P="profile --model synthetic:flash,layers=4 --backend cuda"
prof() {  # bin name args...
  local b=$1 n=$2; shift 2
  { echo "\`$b/dsv4 $P $*\`"; echo; } > $R/flash/$n.md
  timeout 60 $b/dsv4 $P "$@" >> $R/flash/$n.md 2>> $R/flash/$n.log
  echo "$n: $(grep -hE 'replayed step \(|model TFLOP/s' $R/flash/$n.md | cut -c1-100 | tr '\n' ' ') t=$((SECONDS - T0))"
}
check() {  # bin test [args]
  local b=$1 t=$2; shift 2
  timeout 150 $b/$t "$@" > $R/check/${b}_$t.log 2>&1; echo "$b $t rc=$? t=$((SECONDS - T0))"
  grep -E "^\[  FAILED|^\[  PASSED|Failure" $R/check/${b}_$t.log | head -8
}
F='GroupedOutProjFp8.*:LinearFp8BlockTiled.*:LinearSanitizer.*:CudaBackendLinears.*:CudaBackendLinearPath.*'
check gB linear_gpu_test --gtest_filter="$F"
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 gB/linear_gpu_test --gtest_filter='LinearSanitizer.*' > $R/check/gB_linear_memcheck.log 2>&1
echo "memcheck rc=$? t=$((SECONDS - T0))"; tail -n 2 $R/check/gB_linear_memcheck.log
check gC moe_fp4_gpu_test
export DSV4_TEST_DATA="$PWD/tests/data" DSV4_TEST_TMP="/tmp/gt"
for t in golden_gpu_test golden_tp_gpu_test; do DSV4_BINARY="$PWD/gC/dsv4" check gB $t; done
for b in gA gB; do
  DSV4_LINEAR_BENCH_SHAPES=wo_a DSV4_LINEAR_BENCH_ROWS=1,2,4,8,9,16,32 timeout 60 $b/dsv4 bench-ops linear > $R/${b}_bench_linear.md 2> $R/${b}_bench_linear.log
  echo "$b bench linear rc=$? t=$((SECONDS - T0))"; grep -A12 "^### wo_a" $R/${b}_bench_linear.md | grep "^| [0-9]" | cut -c1-120
done
for b in gB gC; do
  DSV4_MOE_BENCH_FORMAT=mxfp4 DSV4_MOE_BENCH_TOKENS=1,4,16,64 DSV4_MOE_BENCH_PATH=decode timeout 90 $b/dsv4 bench-ops moe > $R/${b}_bench_moe.md 2> $R/${b}_bench_moe.log
  echo "$b bench moe rc=$? t=$((SECONDS - T0))"; grep -E "^\| (1|4|16|64) \|" $R/${b}_bench_moe.md | cut -c1-110
done
for b in gA gB gC; do prof $b ${b}_b1_trace --context 4096 --steps 20 --batch-size 1 --trace $R/flash/trace_b1_$b.json; done
for b in 1 1 16 64 1 8 16 64 1 1 8 1 16 1; do
  [ $((SECONDS - T0)) -lt $((LIMIT - 40)) ] || break
  s=$((SECONDS % 100))
  for g in gA gB gC; do prof $g ${g}_b${b}_$s --context 4096 --steps 20 --batch-size $b; done
done
echo "t=$((SECONDS - T0))"
(cd $R && tar czf flash.tgz flash check && rm -rf flash check)
