#!/usr/bin/env bash
# run 2: g8 (the compressors' projections of x in one launch, the part chosen by selects; branches
# on two side streams, or one with DSV4_BRANCHES=1) against g5 (4b15f8e + an experiment knob, off by
# default): GPU tests of g8; batch 1 alternating, three rounds (one traced each); batch 16 and 64;
# the step's first gap with one stream only (DSV4_BRANCHES=0 DSV4_MOE_SHARED_BRANCH=0) and with the
# hc mixes in two launches (DSV4_ONE_LAUNCH=0), traced.
set -u
cd "$(dirname "$0")/.."
R=/tmp/r; mkdir -p $R /tmp/tt
for g in g5 g8; do tar xJf PACKS/$g.tar.xz; done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
for g in g5 g8; do echo "$g $(cat $g/COMMIT)" >> $R/gpu.txt; done
cat $R/gpu.txt
source scripts/nccl-env.sh 2>/dev/null
export DSV4_TEST_DATA=$PWD/tests/data DSV4_TEST_TMP=/tmp/tt
(export LD_LIBRARY_PATH=$PWD/g8/lib DSV4_BINARY=$PWD/g8/dsv4
 timeout 150 g8/linear_gpu_test > $R/linear_gpu_test.txt 2>&1; echo "linear rc=$?" | tee -a $R/tests.txt
 timeout 60 g8/backend_branch_gpu_test > $R/backend_branch_gpu_test.txt 2>&1; echo "backend_branch rc=$?" | tee -a $R/tests.txt
 timeout 150 g8/golden_gpu_test > $R/golden_gpu_test.txt 2>&1; echo "golden rc=$?" | tee -a $R/tests.txt)
tail -n 2 $R/linear_gpu_test.txt $R/backend_branch_gpu_test.txt $R/golden_gpu_test.txt
prof() { local g=$1 b=$2 tag=$3; shift 3; (export LD_LIBRARY_PATH=$PWD/$g/lib; timeout 100 $g/dsv4 profile --model synthetic:flash,layers=4 --backend cuda --context 4096 --steps 20 --batch-size $b "$@" > $R/b${b}_${g}_$tag.md 2> $R/b${b}_${g}_$tag.log; echo "prof $g b$b $tag rc=$?"; grep -E "replayed step \(|copy bandwidth \(" $R/b${b}_${g}_$tag.md | cut -c1-120); }
for r in a b c; do
  if [ $r = a ]; then prof g5 1 $r --trace $R/trace_b1_g5_$r.json; prof g8 1 $r --trace $R/trace_b1_g8_$r.json
  else prof g5 1 $r; prof g8 1 $r; fi
done
DSV4_BRANCHES=1 prof g8 1 one_a --trace $R/trace_b1_g8_one_a.json
DSV4_BRANCHES=1 prof g8 1 one_b
DSV4_BRANCHES=0 DSV4_MOE_SHARED_BRANCH=0 prof g5 1 flat --trace $R/trace_b1_g5_flat.json
DSV4_ONE_LAUNCH=0 prof g5 1 two --trace $R/trace_b1_g5_two.json
for b in 16 64; do prof g5 $b a; prof g8 $b a; done
tar czf $OUT/r.tgz -C /tmp r
