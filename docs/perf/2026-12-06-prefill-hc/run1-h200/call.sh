#!/usr/bin/env bash
# g15 = d556457 (HEAD, whole gpu-bin). Every must-show of the decode-step issue at one commit:
# profile_flash (batch 1, 16, 64; prefill 8192; the on-disk load), two more batch-1 rounds, then
# every GPU test with memcheck (gpu-check, no op benchmarks).
set -u
cd "$(dirname "$0")/.."
R=/tmp/r; mkdir -p $R
T0=$SECONDS
tar xJf PACKS/g15.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
echo "g15 $(cat g15/COMMIT)" >> $R/gpu.txt; cat $R/gpu.txt
export LD_LIBRARY_PATH=$PWD/g15/lib
DSV4=g15/dsv4 timeout 200 scripts/profile_flash.sh $R/flash 4 2; echo "profile_flash rc=$? t=$((SECONDS - T0))"
grep -hE "replayed step \(|copy bandwidth \(|TFLOP/s|loaded |disk read" $R/flash/*.md | cut -c1-160
for r in b c; do
  timeout 60 g15/dsv4 profile --model synthetic:flash,layers=4 --backend cuda --context 4096 --steps 20 --batch-size 1 > $R/flash/decode_b1_$r.md 2>>$R/flash/extra.log
  grep -E "replayed step \(|copy bandwidth \(" $R/flash/decode_b1_$r.md | cut -c1-120
done
echo "t=$((SECONDS - T0))"
GPU_CHECK_OUT=$R/check DSV4_TEST_TIMEOUT=100 timeout $((560 - (SECONDS - T0))) scripts/gpu-check.sh g15 none > $R/check.txt 2>&1
echo "gpu-check rc=$? t=$((SECONDS - T0))"; tail -n 45 $R/check.txt
rm -rf $R/check/tmp
tar czf $OUT/r.tgz -C /tmp r
