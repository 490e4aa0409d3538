#!/usr/bin/env bash
# run 3: g9 (the compressors' projections of x in one launch; the single linear's kernel unchanged)
# against g5 (4b15f8e + an experiment knob, off by default): GPU tests of g9; batch 1 alternating,
# four rounds (the first traced); batch 16 and 64.
set -u
cd "$(dirname "$0")/.."
R=/tmp/r; mkdir -p $R /tmp/tt
for g in g5 g9; do tar xJf PACKS/$g.tar.xz; done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
for g in g5 g9; do echo "$g $(cat $g/COMMIT)" >> $R/gpu.txt; done
cat $R/gpu.txt
source scripts/nccl-env.sh 2>/dev/null
export DSV4_TEST_DATA=$PWD/tests/data DSV4_TEST_TMP=/tmp/tt
(export LD_LIBRARY_PATH=$PWD/g9/lib DSV4_BINARY=$PWD/g9/dsv4
 timeout 150 g9/linear_gpu_test > $R/linear_gpu_test.txt 2>&1; echo "linear rc=$?" | tee -a $R/tests.txt
 timeout 150 g9/golden_gpu_test > $R/golden_gpu_test.txt 2>&1; echo "golden rc=$?" | tee -a $R/tests.txt)
tail -n 2 $R/linear_gpu_test.txt $R/golden_gpu_test.txt
prof() { local g=$1 b=$2 tag=$3; shift 3; (export LD_LIBRARY_PATH=$PWD/$g/lib; timeout 100 $g/dsv4 profile --model synthetic:flash,layers=4 --backend cuda --context 4096 --steps 20 --batch-size $b "$@" > $R/b${b}_${g}_$tag.md 2> $R/b${b}_${g}_$tag.log; echo "prof $g b$b $tag rc=$?"; grep -E "replayed step \(|copy bandwidth \(" $R/b${b}_${g}_$tag.md | cut -c1-120); }
prof g5 1 a --trace $R/trace_b1_g5_a.json; prof g9 1 a --trace $R/trace_b1_g9_a.json
for r in b c d; do prof g5 1 $r; prof g9 1 $r; done
for b in 16 64; do prof g5 $b a; prof g9 $b a; done
tar czf $OUT/r.tgz -C /tmp r
