#!/usr/bin/env bash
# ncu of the tiled FP8-weight kernel (g25) on wo_a at 1 and 64 rows: stall reasons and memory.
set -u
cd "$(dirname "$0")/.."
R=$OUT/r; rm -rf $R; mkdir -p $R
tar xJf PACKS/g25.tar.xz g25
export LD_LIBRARY_PATH=$PWD/g25/lib
for M in 1 64; do
  DSV4_LINEAR_BENCH_SHAPES=wo_a DSV4_LINEAR_BENCH_ROWS=$M timeout 200 ncu --kernel-name regex:linear_fp8w_mma_kernel \
    --launch-skip 20 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section Occupancy \
    --section MemoryWorkloadAnalysis --section LaunchStats --section SchedulerStats g25/dsv4 bench-ops linear > $R/ncu_m$M.txt 2>&1
  echo "M=$M rc=$?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Stall|Warp Cycles Per Issued|Issued Warp|No Eligible|Registers|Block Limit|Waves" $R/ncu_m$M.txt | head -40
done
