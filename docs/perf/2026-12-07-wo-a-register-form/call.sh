#!/usr/bin/env bash
# The packs hold gF = 1ea2807 (hc-comb-branch: post and comb on a stream of their own; with
# DSV4_HC_COMB_BRANCH=0 it runs main's kernels and launches, the baseline) and gG = main + wo_a's
# register form (linear_fp8w_mma at 1-8 rows; its COMMIT).
# 1. gG: the linear tests that reach linear_fp8w_mma (+ memcheck of the sanitizer cases), bench-ops
#    linear on wo_a (gG and gF), the golden tests;
# 2. decode steps: gF off (baseline), gF on, gG alternated; a traced b1 replay of each.
# 3. gF's backend_branch_gpu_test and golden tests if time is left. Outputs packed in flash.tgz.
set -u
cd "$(dirname "$0")/.."
R=$OUT/r; rm -rf $R; mkdir -p $R/flash $R/check
T0=$SECONDS
LIMIT=${LIMIT:-400}  # the seconds this call may take: the profiles stop in time to pack the outputs
tar xJf PACKS/g44.tar.xz; tar xJf PACKS/g45.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
echo "gF $(cat gF/COMMIT); gG $(cat gG/COMMIT)" >> $R/gpu.txt; cat $R/gpu.txt
export LD_LIBRARY_PATH=$PWD/gG/lib
P="profile --model synthetic:flash,layers=4 --backend cuda"
prof() {  # bin branch(0|1) name args...
  local b=$1 v=$2 n=$3; shift 3
  { echo "\`DSV4_HC_COMB_BRANCH=$v $b/dsv4 $P $*\`"; echo; } > $R/flash/$n.md
  DSV4_HC_COMB_BRANCH=$v timeout 60 $b/dsv4 $P "$@" >> $R/flash/$n.md 2>> $R/flash/$n.log
  echo "$n: $(grep -hE 'replayed step \(|model TFLOP/s' $R/flash/$n.md | cut -c1-100 | tr '\n' ' ') t=$((SECONDS - T0))"
  grep -hE '^\| grouped_out_proj \| (CSA|SWA)' $R/flash/$n.md | cut -c1-110
}
check() {  # bin test [args]
  local b=$1 t=$2; shift 2
  timeout 150 $b/$t "$@" > $R/check/${b}_$t.log 2>&1; echo "$b $t rc=$? t=$((SECONDS - T0))"
  grep -E "^\[  FAILED|^\[  PASSED|Failure" $R/check/${b}_$t.log | head -8
}
F='GroupedOutProjFp8.*:LinearFp8BlockTiled.*:LinearSanitizer.*:CudaBackendLinears.*:CudaBackendLinearPath.*'
check gG linear_gpu_test --gtest_filter="$F"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 gG/linear_gpu_test --gtest_filter='LinearSanitizer.*' > $R/check/gG_linear_memcheck.log 2>&1
echo "memcheck rc=$? t=$((SECONDS - T0))"; tail -n 2 $R/check/gG_linear_memcheck.log
for b in gG gF; do
  DSV4_LINEAR_BENCH_SHAPES=wo_a DSV4_LINEAR_BENCH_ROWS=1,2,4,8,9,16,32 timeout 60 $b/dsv4 bench-ops linear > $R/${b}_bench_linear.md 2> $R/${b}_bench_linear.log
  echo "$b bench rc=$? t=$((SECONDS - T0))"; grep -A10 "^### wo_a" $R/${b}_bench_linear.md | grep "^| [0-9]" | cut -c1-120
done
export DSV4_TEST_DATA="$PWD/tests/data" DSV4_TEST_TMP="/tmp/gt"
for t in golden_gpu_test golden_tp_gpu_test; do DSV4_BINARY="$PWD/gG/dsv4" check gG $t; done
prof gG 0 gG_b1_trace --context 4096 --steps 20 --batch-size 1 --trace $R/flash/trace_b1_gG.json
prof gF 0 off_b1_trace --context 4096 --steps 20 --batch-size 1 --trace $R/flash/trace_b1_off.json
prof gF 1 on_b1_trace --context 4096 --steps 20 --batch-size 1 --trace $R/flash/trace_b1_on.json
for b in 1 1 16 64 1 8 16 64 1 1; do
  [ $((SECONDS - T0)) -lt $((LIMIT - 110)) ] || break
  s=$((SECONDS % 100))
  prof gF 0 off_b${b}_$s --context 4096 --steps 20 --batch-size $b
  prof gG 0 gG_b${b}_$s --context 4096 --steps 20 --batch-size $b
  prof gF 1 on_b${b}_$s --context 4096 --steps 20 --batch-size $b
done
if [ $((SECONDS - T0)) -lt $((LIMIT - 90)) ]; then
  check gF backend_branch_gpu_test
  for t in golden_gpu_test golden_tp_gpu_test; do DSV4_BINARY="$PWD/gF/dsv4" check gF $t; done
fi
echo "t=$((SECONDS - T0))"
(cd $R && tar czf flash.tgz flash check && rm -rf flash check)
