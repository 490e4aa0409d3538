#!/usr/bin/env bash
# The pack holds gA = 9315102 (main), gC = 95300d1 (the hyper-connection mixes on the tensor cores, a
# decode batch's tiles shared by a block's 8 warps; measured before) and gD = d12ca97 (gC with the
# decode batch's weight parts split before the programmatic wait; its COMMIT says "+ uncommitted
# changes": a docs file only).
# 1. gD: hyper_connection_gpu_test (+ memcheck of its sanitizer case), the golden tests;
# 2. decode steps of gD, gC and gA alternated, a prefill of gD and gA. Outputs packed in flash.tgz.
set -u
cd "$(dirname "$0")/.."
R=$OUT/r; rm -rf $R; mkdir -p $R/flash $R/check
T0=$SECONDS
LIMIT=${LIMIT:-400}  # the seconds this call may take: the profiles stop in time to pack the outputs
tar xJf PACKS/g42.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
echo "gA $(cat gA/COMMIT); gC $(cat gC/COMMIT); gD $(cat gD/COMMIT)" >> $R/gpu.txt; cat $R/gpu.txt
export LD_LIBRARY_PATH=$PWD/gA/lib
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
  grep -E "^\[  FAILED|^\[  PASSED|Failure" $R/check/${b}_$t.log | head -6
}
check gD hyper_connection_gpu_test
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 gD/hyper_connection_gpu_test --gtest_filter='*Sanitizer*' > $R/check/gD_hc_memcheck.log 2>&1
echo "memcheck rc=$? t=$((SECONDS - T0))"; tail -n 1 $R/check/gD_hc_memcheck.log
export DSV4_TEST_DATA="$PWD/tests/data" DSV4_TEST_TMP="/tmp/gt"
for t in golden_gpu_test golden_tp_gpu_test; do DSV4_BINARY="$PWD/gD/dsv4" check gD $t; done
for b in 64 16 1 32 64 16 1 32 64 16; do
  [ $((SECONDS - T0)) -lt $((LIMIT - 70)) ] || break
  for g in gD gC gA; do prof $g ${g}_b${b}_$((SECONDS % 100)) --context 4096 --steps 20 --batch-size $b; done
done
for g in gD gA; do [ $((SECONDS - T0)) -lt $((LIMIT - 25)) ] && prof $g ${g}_prefill --prefill 8192 --steps 3; done
echo "t=$((SECONDS - T0))"
(cd $R && tar czf flash.tgz flash check && rm -rf flash check)
