#!/usr/bin/env bash
# g29 = baba6bf (its COMMIT): linear_gpu_test after the rows-alone helper, and memcheck of its sanitizer cases.
set -u
cd "$(dirname "$0")/.."
R=$OUT/r; rm -rf $R; mkdir -p $R
tar xJf PACKS/g29.tar.xz
export LD_LIBRARY_PATH=$PWD/g29/lib
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt; echo "g29 $(cat g29/COMMIT)" >> $R/gpu.txt; cat $R/gpu.txt
timeout 200 g29/linear_gpu_test > $R/linear_gpu_test.log 2>&1; echo "linear_gpu_test rc=$?"
grep -E "^\[  FAILED|^\[  PASSED|Failure|RowsDoNotDepend" $R/linear_gpu_test.log | head -12
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 g29/linear_gpu_test --gtest_filter='*Sanitizer*' > $R/linear_memcheck.log 2>&1
echo "memcheck rc=$?"; tail -n 2 $R/linear_memcheck.log
