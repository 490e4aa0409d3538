#!/usr/bin/env bash
# run 2: tests of g3, then batch-1 profiles alternating g0 g2 g3, batch 16 and 64 g0 g3.
set -u
cd "$(dirname "$0")/.."
R=/tmp/r; mkdir -p $R /tmp/tt
for g in g0 g2 g3; do tar xJf PACKS/$g.tar.xz; done
cp -r g0/lib g2/; cp -r g0/lib g3/
source scripts/nccl-env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader > $R/gpu.txt
for g in g0 g2 g3; do echo "$g $(cat $g/COMMIT)" >> $R/gpu.txt; done
export DSV4_TEST_DATA=$PWD/tests/data DSV4_TEST_TMP=/tmp/tt
t() { local g=$1 n=$2; shift 2; (export LD_LIBRARY_PATH=$PWD/$g/lib DSV4_BINARY=$PWD/$g/dsv4; timeout 150 $g/$n "$@" > $R/${n}_$g.txt 2>&1; echo "$n $g rc=$?" | tee -a $R/tests.txt; tail -3 $R/${n}_$g.txt); }
prof() { local g=$1 b=$2 tag=$3; shift 3; (export LD_LIBRARY_PATH=$PWD/$g/lib; timeout 200 $g/dsv4 profile --model synthetic:flash,layers=4 --backend cuda --context 4096 --steps 20 --batch-size $b "$@" > $R/b${b}_${g}_$tag.md 2> $R/b${b}_${g}_$tag.log; echo "prof $g b$b $tag rc=$?"; grep -E "replayed step \(|copy bandwidth" $R/b${b}_${g}_$tag.md | cut -c1-110); }
t g3 golden_gpu_test
t g3 sparse_mla_gpu_test --gtest_filter='*ReferenceRounding*:*PlanComputedOnce*:*CudaGraphReplay*:*CsaTopk*'
(export LD_LIBRARY_PATH=$PWD/g3/lib; timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 g3/sparse_mla_gpu_test --gtest_filter='*Sanitizer*:*PlanComputedOnce*' > $R/memcheck_sparse.txt 2>&1; echo "memcheck sparse rc=$?" | tee -a $R/tests.txt)
for r in a b c; do for g in g0 g2 g3; do prof $g 1 $r --trace $R/trace_b1_${g}_$r.json; done; done
for g in g0 g3; do prof $g 16 a; prof $g 64 a; done
tar czf $OUT/r.tgz -C /tmp r
