#!/usr/bin/env bash
# run 3: the plan's unsplit shortcut (g4): golden and sparse-MLA tests.
set -u
cd "$(dirname "$0")/.."
R=OUT; mkdir -p $R /tmp/tt
tar xJf PACKS/g4.tar.xz
source scripts/nccl-env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt; cat g4/COMMIT >> $R/gpu.txt
export DSV4_TEST_DATA=$PWD/tests/data DSV4_TEST_TMP=/tmp/tt LD_LIBRARY_PATH=$PWD/g4/lib DSV4_BINARY=$PWD/g4/dsv4
timeout 150 g4/golden_gpu_test > $R/golden_gpu_test.txt 2>&1; echo "golden rc=$?" | tee -a $R/tests.txt
timeout 200 g4/sparse_mla_gpu_test --gtest_filter='SparseMlaGpu.*' > $R/sparse_mla_gpu_test.txt 2>&1; echo "sparse_mla rc=$?" | tee -a $R/tests.txt
tail -3 $R/golden_gpu_test.txt $R/sparse_mla_gpu_test.txt
tar czf $OUT/r.tgz -C /tmp r
