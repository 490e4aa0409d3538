#!/usr/bin/env bash
# g23 = 1510b12 (main's code). The issue's H200 figures on the landed code: the 8,192-token prefill
# twice and one batch-1 decode step. Results go straight to $OUT.
set -u
cd "$(dirname "$0")/.."
R=$OUT/r; rm -rf $R; mkdir -p $R
tar xJf PACKS/g23.tar.xz g23
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
echo "g23 $(cat g23/COMMIT)" >> $R/gpu.txt; cat $R/gpu.txt
export LD_LIBRARY_PATH=$PWD/g23/lib
P="profile --model synthetic:flash,layers=4 --backend cuda"
for r in a b; do
  { echo "\`g23/dsv4 $P --prefill 8192 --steps 3\`"; echo; } > $R/prefill_$r.md
  timeout 40 g23/dsv4 $P --prefill 8192 --steps 3 >> $R/prefill_$r.md 2>> $R/profiles.log
  grep -E 'model TFLOP/s|step time' $R/prefill_$r.md | tr '\n' ' ' | cut -c1-200; echo
done
{ echo "\`g23/dsv4 $P --context 4096 --steps 20 --batch-size 1\`"; echo; } > $R/decode_b1.md
timeout 40 g23/dsv4 $P --context 4096 --steps 20 --batch-size 1 >> $R/decode_b1.md 2>> $R/profiles.log
grep -E "replayed step \(|copy bandwidth \(|bytes a step|43 layers" $R/decode_b1.md | cut -c1-160
