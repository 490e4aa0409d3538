#!/usr/bin/env bash
# run 1: g7 (the compressors' projections of x in one launch; branches on two side streams, or one
# with DSV4_BRANCHES=1) against g5 (4b15f8e + an experiment knob, off by default): GPU tests of g7,
# batch 1 alternating (one traced each), the step's first gap with branches in line and with layer
# 0's attention branch in line (g5, DSV4_X_BRANCH_FROM=1).
set -u
cd "$(dirname "$0")/.."
R=/tmp/r; mkdir -p $R /tmp/tt
for g in g5 g7; do tar xJf PACKS/$g.tar.xz; done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
for g in g5 g7; do echo "$g $(cat $g/COMMIT)" >> $R/gpu.txt; done
cat $R/gpu.txt
source scripts/nccl-env.sh 2>/dev/null
export DSV4_TEST_DATA=$PWD/tests/data DSV4_TEST_TMP=/tmp/tt
(export LD_LIBRARY_PATH=$PWD/g7/lib DSV4_BINARY=$PWD/g7/dsv4
 timeout 100 g7/linear_gpu_test --gtest_filter='LinearBf16w.*:CudaBackendLinears.*:LinearSplitK.*' > $R/linear_gpu_test.txt 2>&1; echo "linear rc=$?" | tee -a $R/tests.txt
 timeout 60 g7/backend_branch_gpu_test > $R/backend_branch_gpu_test.txt 2>&1; echo "backend_branch rc=$?" | tee -a $R/tests.txt
 timeout 150 g7/golden_gpu_test > $R/golden_gpu_test.txt 2>&1; echo "golden rc=$?" | tee -a $R/tests.txt)
tail -n 2 $R/linear_gpu_test.txt $R/backend_branch_gpu_test.txt $R/golden_gpu_test.txt
prof() { local g=$1 b=$2 tag=$3; shift 3; (export LD_LIBRARY_PATH=$PWD/$g/lib; timeout 100 $g/dsv4 profile --model synthetic:flash,layers=4 --backend cuda --context 4096 --steps 20 --batch-size $b "$@" > $R/b${b}_${g}_$tag.md 2> $R/b${b}_${g}_$tag.log; echo "prof $g b$b $tag rc=$?"; grep -E "replayed step \(|copy bandwidth \(" $R/b${b}_${g}_$tag.md | cut -c1-120); }
prof g5 1 a --trace $R/trace_b1_g5_a.json
prof g7 1 a --trace $R/trace_b1_g7_a.json
DSV4_BRANCHES=1 prof g7 1 one_a --trace $R/trace_b1_g7_one_a.json
DSV4_BRANCHES=0 prof g5 1 nobr --trace $R/trace_b1_g5_nobr.json
DSV4_X_BRANCH_FROM=1 prof g5 1 from1 --trace $R/trace_b1_g5_from1.json
prof g5 1 b
prof g7 1 b
DSV4_BRANCHES=1 prof g7 1 one_b
tar czf $OUT/r.tgz -C /tmp r
