#!/usr/bin/env bash
# run 4: the landed code (g9 = 03ac3ef) and main before it (g5 = 4b15f8e + a knob, off) on whatever
# GPU comes: batch 1 alternating, three rounds; batch 16 and 64.
set -u
cd "$(dirname "$0")/.."
R=/tmp/r; mkdir -p $R
for g in g5 g9; do tar xJf PACKS/$g.tar.xz; done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
for g in g5 g9; do echo "$g $(cat $g/COMMIT)" >> $R/gpu.txt; done
cat $R/gpu.txt
prof() { local g=$1 b=$2 tag=$3; shift 3; (export LD_LIBRARY_PATH=$PWD/$g/lib; timeout 100 $g/dsv4 profile --model synthetic:flash,layers=4 --backend cuda --context 4096 --steps 20 --batch-size $b "$@" > $R/b${b}_${g}_$tag.md 2> $R/b${b}_${g}_$tag.log; echo "prof $g b$b $tag rc=$?"; grep -E "replayed step \(|copy bandwidth \(|^from the traced" $R/b${b}_${g}_$tag.md | cut -c1-200); }
prof g5 1 a --trace $R/trace_b1_g5_a.json; prof g9 1 a --trace $R/trace_b1_g9_a.json
for r in b c; do prof g5 1 $r; prof g9 1 $r; done
for b in 16 64; do prof g5 $b a; prof g9 $b a; done
tar czf $OUT/r.tgz -C /tmp r
