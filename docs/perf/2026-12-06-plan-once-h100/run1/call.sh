#!/usr/bin/env bash
# run 1: tests of g2, then batch-1 profiles alternating g0 g1 g2, batch 16 g0 g2.
set -u
cd "$(dirname "$0")/.."
R=/tmp/r; mkdir -p $R /tmp/tt
for g in g0 g1 g2; do tar xJf PACKS/$g.tar.xz; done
cp -r g0/lib g1/; cp -r g0/lib g2/
source scripts/nccl-env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader > $R/gpu.txt
for g in g0 g1 g2; do echo "$g $(cat $g/COMMIT)" >> $R/gpu.txt; done
export DSV4_TEST_DATA=$PWD/tests/data DSV4_TEST_TMP=/tmp/tt
t() { local g=$1 n=$2; shift 2; (export LD_LIBRARY_PATH=$PWD/$g/lib DSV4_BINARY=$PWD/$g/dsv4; timeout 120 $g/$n "$@" > $R/${n}_$g.txt 2>&1; echo "$n $g rc=$?" | tee -a $R/tests.txt; tail -3 $R/${n}_$g.txt); }
prof() { local g=$1 b=$2 tag=$3; shift 3; (export LD_LIBRARY_PATH=$PWD/$g/lib; timeout 200 $g/dsv4 profile --model synthetic:flash,layers=4 --backend cuda --context 4096 --steps 20 --batch-size $b "$@" > $R/b${b}_${g}_$tag.md 2> $R/b${b}_${g}_$tag.log; echo "prof $g b$b $tag rc=$?"; grep -E "replayed step \(|copy bandwidth" $R/b${b}_${g}_$tag.md); }
t g2 golden_gpu_test
t g2 sparse_mla_gpu_test
t g2 router_compressor_gpu_test
t g2 moe_fp4_gpu_test
(export LD_LIBRARY_PATH=$PWD/g2/lib; timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 g2/router_compressor_gpu_test > $R/memcheck_router.txt 2>&1; echo "memcheck router rc=$?" | tee -a $R/tests.txt)
for r in a b c; do for g in g0 g1 g2; do prof $g 1 $r --trace $R/trace_b1_${g}_$r.json; done; done
for g in g0 g2; do prof $g 16 a; done
tar czf $OUT/r.tgz -C /tmp r
