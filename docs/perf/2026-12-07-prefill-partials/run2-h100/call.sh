#!/usr/bin/env bash
# g19 = f7c80ed; g20 = f7c80ed + a switch for the prefill partials kernel's tokens a warp
# (DSV4_HC_TILE 2/3/4) and token groups a block (DSV4_HC_GROUPS), from 2,048 rows (an experiment:
# tile 4 / groups 8 is f7c80ed's kernel). The prefill of 8,192 tokens alternating the forms, then ncu
# of the partials kernel in each.
set -u
cd "$(dirname "$0")/.."
R=/tmp/r; mkdir -p $R
T0=$SECONDS
for g in g19 g20; do tar xJf PACKS/$g.tar.xz; done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
for g in g19 g20; do echo "$g $(cat $g/COMMIT)" >> $R/gpu.txt; done; cat $R/gpu.txt
pf() { local g=$1 tag=$2; shift 2
  [ $((SECONDS - T0)) -gt 400 ] && { echo "skip $g $tag"; return; }
  (export LD_LIBRARY_PATH=$PWD/$g/lib; env "$@" timeout 90 $g/dsv4 profile --model synthetic:flash,layers=4 --backend cuda --prefill 8192 --steps 3 > $R/prefill_${g}_$tag.md 2>> $R/profiles.log)
  echo "prefill $g $tag $* t=$((SECONDS - T0)): $(grep -E 'model TFLOP/s|step \(plan' $R/prefill_${g}_$tag.md | tr '\n' ' ' | cut -c1-160)"; }
for r in a b; do
  pf g19 $r X=1; pf g20 t4g8$r DSV4_HC_TILE=4 DSV4_HC_GROUPS=8; pf g20 t2g8$r DSV4_HC_TILE=2 DSV4_HC_GROUPS=8
  pf g20 t2g16$r DSV4_HC_TILE=2 DSV4_HC_GROUPS=16; pf g20 t3g8$r DSV4_HC_TILE=3 DSV4_HC_GROUPS=8
done
(export LD_LIBRARY_PATH=$PWD/g20/lib
 for v in "4 8" "2 8" "2 16" "3 8"; do set -- $v
   [ $((SECONDS - T0)) -gt 520 ] && break
   DSV4_HC_TILE=$1 DSV4_HC_GROUPS=$2 timeout 60 ncu --clock-control none --kernel-name regex:'hc_mix_partials' --launch-count 6 --metrics gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed --csv --page raw --print-units base g20/dsv4 profile --model synthetic:flash,layers=4 --backend cuda --prefill 8192 --steps 1 > $R/ncu_t$1g$2.csv 2>&1
   echo "ncu t$1 g$2 rc=$? t=$((SECONDS - T0))"; done)
tar czf $OUT/r.tgz -C /tmp r
