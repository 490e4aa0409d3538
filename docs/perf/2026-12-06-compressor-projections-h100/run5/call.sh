#!/usr/bin/env bash
# run 5: g10 (the KV row's branch on a stream of the highest launch priority) against itself with
# DSV4_URGENT_BRANCHES=0 (the side stream, as 03ac3ef) and g9 (03ac3ef): GPU tests of g10; batch 1
# alternating, three rounds (the first traced); batch 16 and 64.
set -u
cd "$(dirname "$0")/.."
R=$OUT/r; mkdir -p $R /tmp/tt
for g in g9 g10; do tar xJf PACKS/$g.tar.xz; done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
for g in g9 g10; do echo "$g $(cat $g/COMMIT)" >> $R/gpu.txt; done
cat $R/gpu.txt
export DSV4_TEST_DATA=$PWD/tests/data DSV4_TEST_TMP=/tmp/tt
(export LD_LIBRARY_PATH=$PWD/g10/lib DSV4_BINARY=$PWD/g10/dsv4
 timeout 60 g10/backend_branch_gpu_test > $R/backend_branch_gpu_test.txt 2>&1; echo "backend_branch rc=$?" | tee -a $R/tests.txt
 timeout 100 g10/golden_gpu_test > $R/golden_gpu_test.txt 2>&1; echo "golden rc=$?" | tee -a $R/tests.txt)
tail -n 2 $R/backend_branch_gpu_test.txt $R/golden_gpu_test.txt
prof() { local g=$1 b=$2 tag=$3; shift 3; (export LD_LIBRARY_PATH=$PWD/$g/lib; timeout 100 $g/dsv4 profile --model synthetic:flash,layers=4 --backend cuda --context 4096 --steps 20 --batch-size $b "$@" > $R/b${b}_${g}_$tag.md 2> $R/b${b}_${g}_$tag.log; echo "prof $g b$b $tag rc=$?"; grep -E "replayed step \(|^from the traced" $R/b${b}_${g}_$tag.md | cut -c1-200); }
prof g10 1 a --trace $R/trace_b1_g10_a.json; DSV4_URGENT_BRANCHES=0 prof g10 1 side_a --trace $R/trace_b1_g10_side_a.json; prof g9 1 a
for r in b c; do prof g10 1 $r; DSV4_URGENT_BRANCHES=0 prof g10 1 side_$r; prof g9 1 $r; done
for b in 16 64; do prof g10 $b a; DSV4_URGENT_BRANCHES=0 prof g10 $b side_a; done
true
