#!/usr/bin/env bash
# The pack holds gE = 4d58296: a decode step's post and comb (the Sinkhorn) on a branch beside the chain;
# DSV4_HC_COMB_BRANCH=0 gives the code before it (the Sinkhorn in the mix launch), so the A/B is one binary.
# 1. gE: hyper_connection_gpu_test (+ memcheck of its sanitizer case), backend_branch_gpu_test, the golden tests;
# 2. decode steps with the branch on and off, alternated; a traced b1 replay of each; a prefill.
#    Outputs packed in flash.tgz.
set -u
cd "$(dirname "$0")/.."
R=$OUT/r; rm -rf $R; mkdir -p $R/flash $R/check
T0=$SECONDS
LIMIT=${LIMIT:-450}  # the seconds this call may take: the profiles stop in time to pack the outputs
tar xJf PACKS/g43.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
echo "gE $(cat gE/COMMIT)" >> $R/gpu.txt; cat $R/gpu.txt
export LD_LIBRARY_PATH=$PWD/gE/lib
P="profile --model synthetic:flash,layers=4 --backend cuda"
prof() {  # branch(0|1) name args...
  local v=$1 n=$2; shift 2
  { echo "\`DSV4_HC_COMB_BRANCH=$v gE/dsv4 $P $*\`"; echo; } > $R/flash/$n.md
  DSV4_HC_COMB_BRANCH=$v timeout 60 gE/dsv4 $P "$@" >> $R/flash/$n.md 2>> $R/flash/$n.log
  echo "$n: $(grep -hE 'replayed step \(|model TFLOP/s' $R/flash/$n.md | cut -c1-100 | tr '\n' ' ') t=$((SECONDS - T0))"
}
check() {  # test [args]
  local t=$1; shift
  timeout 150 gE/$t "$@" > $R/check/$t.log 2>&1; echo "$t rc=$? t=$((SECONDS - T0))"
  grep -E "^\[  FAILED|^\[  PASSED|Failure" $R/check/$t.log | head -6
}
check hyper_connection_gpu_test
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 gE/hyper_connection_gpu_test --gtest_filter='*Sanitizer*' > $R/check/hc_memcheck.log 2>&1
echo "memcheck rc=$? t=$((SECONDS - T0))"; tail -n 1 $R/check/hc_memcheck.log
check backend_branch_gpu_test
export DSV4_TEST_DATA="$PWD/tests/data" DSV4_TEST_TMP="/tmp/gt"
for t in golden_gpu_test golden_tp_gpu_test; do DSV4_BINARY="$PWD/gE/dsv4" check $t; done
prof 1 on_b1_trace --context 4096 --steps 20 --batch-size 1 --trace $R/flash/trace_b1_on.json
prof 0 off_b1_trace --context 4096 --steps 20 --batch-size 1 --trace $R/flash/trace_b1_off.json
for b in 1 16 64 1 16 64 1 1; do
  [ $((SECONDS - T0)) -lt $((LIMIT - 90)) ] || break
  for v in 1 0; do prof $v $([ $v = 1 ] && echo on || echo off)_b${b}_$((SECONDS % 100)) --context 4096 --steps 20 --batch-size $b; done
done
[ $((SECONDS - T0)) -lt $((LIMIT - 30)) ] && prof 1 on_prefill --prefill 8192 --steps 3
echo "t=$((SECONDS - T0))"
(cd $R && tar czf flash.tgz flash check && rm -rf flash check)
