#!/usr/bin/env bash
# The pack holds gA = 9315102 (main: the tiled FP8 linears from 4096 columns, da65ee9, never run on a
# GPU before), gB = 3e3a737 (gA + the hyper-connection mixes on the tensor cores, a 16-row tile a warp
# at every row count above 2) and gC = 95300d1 (gB + a decode batch's tiles shared by a block's warps).
# 1. gC: hyper_connection_gpu_test (+ memcheck of its sanitizer case), the golden tests; gA: the golden
#    tests and the backend's linear cases (its change chooses a linear's path in the backend);
# 2. ncu of the hc partials kernel at the 8,192-token prefill, gA and gC;
# 3. decode steps (gA, gB, gC) and prefills (gA, gC) alternated. Outputs packed in flash.tgz.
set -u
cd "$(dirname "$0")/.."
R=$OUT/r; rm -rf $R; mkdir -p $R/flash $R/check
T0=$SECONDS
LIMIT=${LIMIT:-560}  # the seconds this call may take: the profiles stop in time to pack the outputs
tar xJf PACKS/g41.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
echo "gA $(cat gA/COMMIT); gB $(cat gB/COMMIT); gC $(cat gC/COMMIT)" >> $R/gpu.txt; cat $R/gpu.txt
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
check gC hyper_connection_gpu_test
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 gC/hyper_connection_gpu_test --gtest_filter='*Sanitizer*' > $R/check/gC_hc_memcheck.log 2>&1
echo "memcheck rc=$? t=$((SECONDS - T0))"; tail -n 1 $R/check/gC_hc_memcheck.log
export DSV4_TEST_DATA="$PWD/tests/data" DSV4_TEST_TMP="/tmp/gt"
for g in gC gA; do for t in golden_gpu_test golden_tp_gpu_test; do DSV4_BINARY="$PWD/$g/dsv4" check $g $t; done; done
check gA linear_gpu_test --gtest_filter='CudaBackend*:GroupedOutProj*:LinearSanitizer*'
for g in gA gC; do
  timeout 100 ncu --clock-control none --kernel-name regex:'hc_mix_partials' --launch-count 6 --metrics gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed --csv --page raw --print-units base $g/dsv4 $P --prefill 8192 --steps 1 > $R/ncu_partials_$g.csv 2> $R/ncu_partials_$g.log
  echo "ncu $g rc=$? t=$((SECONDS - T0))"; grep -c hc_mix_partials $R/ncu_partials_$g.csv
done
for r in 1 2; do
  for g in gC gA; do [ $((SECONDS - T0)) -lt $((LIMIT - 260)) ] && prof $g ${g}_prefill_$r --prefill 8192 --steps 3; done
done
for b in 1 16 64 32 1 16 64 32; do
  [ $((SECONDS - T0)) -lt $((LIMIT - 40)) ] || break
  for g in gC gA gB; do
    [ $b = 1 ] && [ $g = gB ] && continue  # (batch 1 runs the fused form, the same code in gB and gC)
    prof $g ${g}_b${b}_$((SECONDS % 100)) --context 4096 --steps 20 --batch-size $b
  done
done
echo "t=$((SECONDS - T0))"
(cd $R && tar czf flash.tgz flash check && rm -rf flash check)
