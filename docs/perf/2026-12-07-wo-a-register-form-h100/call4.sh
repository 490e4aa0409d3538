#!/usr/bin/env bash
# gA = main, gB = wo_a's register form (16-row tile at 7 stages, 71.75 KB), gD = gB with the 16-row
# tile at 8 stages (82 KB). Decode steps alternated gA / gB / gD first (batch 16, 1, 8), then gD's
# tests of linear_fp8w_mma and memcheck, then more steps until LIMIT. Every output is written as it
# comes (a call cut short still returns what it wrote).
set -u
R=$OUT/r; rm -rf $R; mkdir -p $R/flash $R/check; T0=$SECONDS
LIMIT=${LIMIT:-150}
for p in PACKS/g*.tar.xz; do tar xJf $p; done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
echo "gA $(cat gA/COMMIT); gB $(cat gB/COMMIT); gD $(cat gD/COMMIT)" >> $R/gpu.txt; cat $R/gpu.txt
export LD_LIBRARY_PATH=$PWD/gB/lib
P="profile --model synthetic:flash,layers=4 --backend cuda"
round() {
  local b=$1 s=$((SECONDS % 100))
  for g in gA gB gD; do n=${g}_b${b}_$s; { echo "\`$g/dsv4 $P --context 4096 --steps 20 --batch-size $b\`"; echo; } > $R/flash/$n.md; timeout 60 $g/dsv4 $P --context 4096 --steps 20 --batch-size $b >> $R/flash/$n.md 2>> $R/flash/$n.log; echo "$n: $(grep -hE 'replayed step \(' $R/flash/$n.md | cut -c1-100) t=$((SECONDS - T0))"; done
}
round 16; round 1; round 16; round 8
F='GroupedOutProjFp8.RowsDoNotDependOnTheBatch:LinearSanitizer.*:LinearFp8BlockTiled.*'
timeout 100 gD/linear_gpu_test --gtest_filter="$F" > $R/check/gD_linear_gpu_test.log 2>&1; echo "gD linear rc=$? t=$((SECONDS - T0))"
grep -E "^\[  FAILED|^\[  PASSED|Failure" $R/check/gD_linear_gpu_test.log | head -8
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 gD/linear_gpu_test --gtest_filter='LinearSanitizer.*' > $R/check/gD_linear_memcheck.log 2>&1
echo "memcheck rc=$? t=$((SECONDS - T0))"; tail -n 1 $R/check/gD_linear_memcheck.log
for b in 16 64 1 16 8 1 16; do [ $((SECONDS - T0)) -lt $((LIMIT - 10)) ] || break; round $b; done
echo "t=$((SECONDS - T0))"
