#!/usr/bin/env bash
# g15 = d556457. Where the 8,192-token prefill's time goes, kernel by kernel (ncu, every launch of one
# prefill step, a few metrics), then the hc mix kernels in detail (ncu --set full, one launch each).
set -u
cd "$(dirname "$0")/.."
R=/tmp/r; mkdir -p $R
T0=$SECONDS
tar xJf PACKS/g15.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
echo "g15 $(cat g15/COMMIT)" >> $R/gpu.txt; cat $R/gpu.txt
export LD_LIBRARY_PATH=$PWD/g15/lib
P="g15/dsv4 profile --model synthetic:flash,layers=4 --backend cuda --prefill 8192 --steps 1"
C1="ncu --clock-control none --launch-count 400 --metrics gpu__time_duration.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,dram__bytes.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__occupancy_limit_registers --csv --page raw --print-units base $P"
echo "$C1" > $R/ncu_all_cmd.txt
timeout 300 $C1 > $R/ncu_all.csv 2> $R/ncu_all.log; echo "ncu all rc=$? t=$((SECONDS - T0))"
for k in hc_mix_partials_kernel hc_mix_finish_kernel hc_post_kernel; do
  [ $((SECONDS - T0)) -gt 480 ] && break
  C2="ncu --clock-control none --kernel-name $k --launch-skip 1 --launch-count 1 --set full --import-source no -f -o $R/$k $P"
  echo "$C2" > $R/$k.cmd.txt
  timeout 120 $C2 > $R/$k.log 2>&1; echo "$k rc=$? t=$((SECONDS - T0))"
  ncu --import $R/$k.ncu-rep --page details > $R/$k.details.txt 2>&1
  grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Warp Cycles Per Issued|Block Limit" $R/$k.details.txt | head -14
done
rm -f $R/*.ncu-rep.tmp
tar czf $OUT/r.tgz -C /tmp r
