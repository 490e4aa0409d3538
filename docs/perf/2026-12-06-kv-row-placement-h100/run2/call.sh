#!/usr/bin/env bash
# g13 = af26ba0 + norm_rope as a block per head (a warp per 64 channels, cos/sin before the wait) + the
# per-head norm (head_norm_rope) holding its values in registers + the FP8 linear loading its first
# weight step before the programmatic wait + the FP8 linear quantising its bf16 input itself at 1-8
# rows (no act_quant kernel before wo_b). Experiment knobs, off by default:
#  DSV4_X_NO_FUSEDQ=1: the separate act_quant kernel again;
#  DSV4_X_CSA=1: CSA's indexer head weights first in the compressor branch (not after the compressors);
#  DSV4_X_CSA=2: and CSA's index tables on the main chain after the indexer q's Hadamard.
# g9 = 03ac3ef (HEAD's code).
# Tests: linear (the quantising form's bits), row_ops with memcheck and racecheck of norm_rope, golden
# plain and under C2; batch 1: g9, g13, NQ, C1, C2 alternating, four rounds (the first traced);
# batch 16 and 64: g9, g13, C2.
set -u
cd "$(dirname "$0")/.."
R=/tmp/r; mkdir -p $R /tmp/tt
T0=$SECONDS
for g in g9 g13; do tar xJf PACKS/$g.tar.xz; done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
for g in g9 g13; do echo "$g $(cat $g/COMMIT)" >> $R/gpu.txt; done
cat $R/gpu.txt
export DSV4_TEST_DATA=$PWD/tests/data DSV4_TEST_TMP=/tmp/tt
(export LD_LIBRARY_PATH=$PWD/g13/lib DSV4_BINARY=$PWD/g13/dsv4
 timeout 120 g13/linear_gpu_test > $R/linear_gpu_test.txt 2>&1; echo "linear rc=$?" | tee -a $R/tests.txt
 timeout 60 g13/row_ops_gpu_test > $R/row_ops_gpu_test.txt 2>&1; echo "row_ops rc=$?" | tee -a $R/tests.txt
 timeout 60 compute-sanitizer --tool memcheck g13/row_ops_gpu_test --gtest_filter='RowOpsNormRope*' > $R/memcheck.txt 2>&1; echo "memcheck rc=$?" | tee -a $R/tests.txt
 timeout 60 compute-sanitizer --tool racecheck g13/row_ops_gpu_test --gtest_filter='RowOpsNormRope*' > $R/racecheck.txt 2>&1; echo "racecheck rc=$?" | tee -a $R/tests.txt
 timeout 60 compute-sanitizer --tool memcheck g13/linear_gpu_test --gtest_filter='*QuantisingRows*' > $R/memcheck_linear.txt 2>&1; echo "memcheck linear rc=$?" | tee -a $R/tests.txt
 timeout 120 g13/golden_gpu_test > $R/golden_gpu_test.txt 2>&1; echo "golden rc=$?" | tee -a $R/tests.txt
 DSV4_X_CSA=2 timeout 120 g13/golden_gpu_test > $R/golden_gpu_test_C2.txt 2>&1; echo "golden C2 rc=$?" | tee -a $R/tests.txt)
tail -n 1 $R/linear_gpu_test.txt $R/row_ops_gpu_test.txt $R/golden_gpu_test*.txt; tail -n 2 $R/memcheck*.txt $R/racecheck.txt
grep -E "FAILED|Failure" $R/linear_gpu_test.txt | head -5
prof() { local v=$1 b=$2 tag=$3; shift 3; local g=g13 N=0 C=0
  [ $((SECONDS - T0)) -gt 470 ] && { echo "skip $v b$b $tag"; return; }
  case $v in g9) g=g9;; NQ) N=1;; C1) C=1;; C2) C=2;; esac
  (export LD_LIBRARY_PATH=$PWD/$g/lib DSV4_X_NO_FUSEDQ=$N DSV4_X_CSA=$C; timeout 90 $g/dsv4 profile --model synthetic:flash,layers=4 --backend cuda --context 4096 --steps 20 --batch-size $b "$@" > $R/b${b}_${v}_$tag.md 2>> $R/profiles.log; echo "prof $v b$b $tag rc=$? t=$((SECONDS - T0))"; grep -E "replayed step \(|copy bandwidth \(" $R/b${b}_${v}_$tag.md | cut -c1-110); }
for v in g9 g13 NQ C1 C2; do prof $v 1 a --trace $R/trace_b1_${v}_a.json; done
for r in b c d; do for v in g9 g13 NQ C1 C2; do prof $v 1 $r; done; done
for b in 16 64; do for v in g9 g13 C2; do prof $v $b a; done; done
tar czf $OUT/r.tgz -C /tmp r
