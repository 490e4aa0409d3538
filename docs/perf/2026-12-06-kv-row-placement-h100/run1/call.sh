#!/usr/bin/env bash
# g11 = af26ba0 + experiment knobs (off by default):
#  DSV4_X_FP8_PRELOAD=p+10*S: the FP8 linear, before its programmatic wait, loads its first weight step
#    into registers (p=1) and asks L1 for its first S steps' weight lines;
#  DSV4_X_KV_MAIN=1: the KV row's norm_rope on the main chain before q's norm; =2: and HCA's index
#    tables in the compressor branch (the KV branch holds only the cache write).
# Tests under the knobs; batch 1: six variants alternating, three rounds (the first traced); batch 16
# and 64 for the base and one combination. Profiles stop being started after 480 s.
set -u
cd "$(dirname "$0")/.."
R=/tmp/r; mkdir -p $R /tmp/tt
T0=$SECONDS
tar xJf PACKS/g11.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
echo "g11 $(cat g11/COMMIT)" >> $R/gpu.txt
cat $R/gpu.txt
export DSV4_TEST_DATA=$PWD/tests/data DSV4_TEST_TMP=/tmp/tt
(export LD_LIBRARY_PATH=$PWD/g11/lib DSV4_BINARY=$PWD/g11/dsv4 DSV4_X_FP8_PRELOAD=41 DSV4_X_KV_MAIN=2
 timeout 120 g11/linear_gpu_test > $R/linear_gpu_test.txt 2>&1; echo "linear rc=$?" | tee -a $R/tests.txt
 timeout 150 g11/golden_gpu_test > $R/golden_gpu_test.txt 2>&1; echo "golden rc=$?" | tee -a $R/tests.txt)
tail -n 2 $R/linear_gpu_test.txt $R/golden_gpu_test.txt
prof() { local v=$1 b=$2 tag=$3; shift 3; local P=0 K=0
  [ $((SECONDS - T0)) -gt 480 ] && { echo "skip $v b$b $tag"; return; }
  case $v in P1) P=1;; PL4) P=41;; PL8) P=81;; K2) K=2;; PL4K2) P=41; K=2;; esac
  (export LD_LIBRARY_PATH=$PWD/g11/lib DSV4_X_FP8_PRELOAD=$P DSV4_X_KV_MAIN=$K; timeout 90 g11/dsv4 profile --model synthetic:flash,layers=4 --backend cuda --context 4096 --steps 20 --batch-size $b "$@" > $R/b${b}_${v}_$tag.md 2>> $R/profiles.log; echo "prof $v b$b $tag rc=$? t=$((SECONDS - T0))"; grep -E "replayed step \(|copy bandwidth \(" $R/b${b}_${v}_$tag.md | cut -c1-110); }
for v in base P1 PL4 PL8 K2 PL4K2; do prof $v 1 a --trace $R/trace_b1_${v}_a.json; done
for r in b c; do for v in base P1 PL4 PL8 K2 PL4K2; do prof $v 1 $r; done; done
for b in 16 64; do prof base $b a; prof PL4K2 $b a; done
tar czf $OUT/r.tgz -C /tmp r
