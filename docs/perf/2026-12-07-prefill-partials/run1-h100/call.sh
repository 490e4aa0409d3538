#!/usr/bin/env bash
# g15 = d556457; g19 = f7c80ed (the landed hc kernels: finishing chunks sized by D, hc_post 8 channels a thread from 64 rows).
# Tests of g19 (hyper_connection with memcheck of its sanitizer case, golden), then the prefill of
# 8,192 tokens alternating g15 / g19, and batch 1 / 16 / 64 decode (batch 1 twice).
set -u
cd "$(dirname "$0")/.."
R=/tmp/r; mkdir -p $R /tmp/tt
T0=$SECONDS
for g in g15 g19; do tar xJf PACKS/$g.tar.xz; done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
for g in g15 g19; do echo "$g $(cat $g/COMMIT)" >> $R/gpu.txt; done; cat $R/gpu.txt
export DSV4_TEST_DATA=$PWD/tests/data DSV4_TEST_TMP=/tmp/tt
(export LD_LIBRARY_PATH=$PWD/g19/lib DSV4_BINARY=$PWD/g19/dsv4
 timeout 120 g19/hyper_connection_gpu_test > $R/hyper_connection_gpu_test.txt 2>&1; echo "hc rc=$?" | tee -a $R/tests.txt
 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 g19/hyper_connection_gpu_test --gtest_filter='*Sanitizer*' > $R/hc_memcheck.txt 2>&1; echo "hc memcheck rc=$?" | tee -a $R/tests.txt
 timeout 120 g19/golden_gpu_test > $R/golden_gpu_test.txt 2>&1; echo "golden rc=$?" | tee -a $R/tests.txt)
tail -n 2 $R/hyper_connection_gpu_test.txt $R/golden_gpu_test.txt; grep -E "ERROR SUMMARY" $R/hc_memcheck.txt
pf() { local g=$1 tag=$2; shift 2
  [ $((SECONDS - T0)) -gt 420 ] && { echo "skip $g $tag"; return; }
  (export LD_LIBRARY_PATH=$PWD/$g/lib; env "$@" timeout 90 $g/dsv4 profile --model synthetic:flash,layers=4 --backend cuda --prefill 8192 --steps 3 > $R/prefill_${g}_$tag.md 2>> $R/profiles.log)
  echo "prefill $g $tag $* t=$((SECONDS - T0)): $(grep -E 'model TFLOP/s|step \(plan' $R/prefill_${g}_$tag.md | tr '\n' ' ' | cut -c1-200)"; }
pf g15 a X=1; pf g19 a X=1; pf g15 b X=1; pf g19 b X=1; pf g15 c X=1; pf g19 c X=1
n=0; for b in 1 16 64 1; do for g in g15 g19; do n=$((n+1)); f=$R/b${b}_${g}_$n.md
  [ $((SECONDS - T0)) -gt 520 ] && break
  (export LD_LIBRARY_PATH=$PWD/$g/lib; timeout 60 $g/dsv4 profile --model synthetic:flash,layers=4 --backend cuda --context 4096 --steps 20 --batch-size $b > $f 2>> $R/profiles.log)
  echo "b$b $g: $(grep -E 'replayed step \(' $f | cut -c1-90)"; done; done
tar czf $OUT/r.tgz -C /tmp r
