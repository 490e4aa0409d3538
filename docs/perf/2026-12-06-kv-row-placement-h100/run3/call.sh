#!/usr/bin/env bash
# g14 = the code to be committed: norm_rope as a block per head (cos/sin before the wait), the per-head
# norm's values in registers, the FP8 linear's first weight step before the wait, CSA's head weights
# first in the compressors' branch and its index tables on the main chain. g9 = the code of 03ac3ef.
# Tests (golden, row_ops, linear); batch 1: g9, g14 alternating, five rounds (the first traced);
# batch 16 and 64: two rounds each.
set -u
cd "$(dirname "$0")/.."
R=/tmp/r; mkdir -p $R /tmp/tt
T0=$SECONDS
for g in g9 g14; do tar xJf PACKS/$g.tar.xz; done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
for g in g9 g14; do echo "$g $(cat $g/COMMIT)" >> $R/gpu.txt; done
cat $R/gpu.txt
export DSV4_TEST_DATA=$PWD/tests/data DSV4_TEST_TMP=/tmp/tt
(export LD_LIBRARY_PATH=$PWD/g14/lib DSV4_BINARY=$PWD/g14/dsv4
 timeout 120 g14/golden_gpu_test > $R/golden_gpu_test.txt 2>&1; echo "golden rc=$?" | tee -a $R/tests.txt
 timeout 60 g14/row_ops_gpu_test > $R/row_ops_gpu_test.txt 2>&1; echo "row_ops rc=$?" | tee -a $R/tests.txt
 timeout 120 g14/linear_gpu_test > $R/linear_gpu_test.txt 2>&1; echo "linear rc=$?" | tee -a $R/tests.txt)
tail -n 1 $R/golden_gpu_test.txt $R/row_ops_gpu_test.txt $R/linear_gpu_test.txt
prof() { local g=$1 b=$2 tag=$3; shift 3
  [ $((SECONDS - T0)) -gt 400 ] && { echo "skip $g b$b $tag"; return; }
  (export LD_LIBRARY_PATH=$PWD/$g/lib; timeout 90 $g/dsv4 profile --model synthetic:flash,layers=4 --backend cuda --context 4096 --steps 20 --batch-size $b "$@" > $R/b${b}_${g}_$tag.md 2>> $R/profiles.log; echo "prof $g b$b $tag rc=$? t=$((SECONDS - T0))"; grep -E "replayed step \(|copy bandwidth \(" $R/b${b}_${g}_$tag.md | cut -c1-110); }
for g in g9 g14; do prof $g 1 a --trace $R/trace_b1_${g}_a.json; done
for r in b c d e; do for g in g9 g14; do prof $g 1 $r; done; done
for b in 16 64; do for r in a b; do for g in g9 g14; do prof $g $b $r; done; done; done
tar czf $OUT/r.tgz -C /tmp r
