# Run 2: the command sent to the GPU machine, right after run 1 on the same (still warm) machine.
# It wrote the script below to PACKS/call2.sh and ran it (gpu.txt as in run 1; gC not used).
set -u
R=$OUT/r; mkdir -p $R/flash; T0=$SECONDS
for p in PACKS/gA.tar.xz PACKS/gB.tar.xz; do tar xJf $p; done
export LD_LIBRARY_PATH=$PWD/gB/lib
P="profile --model synthetic:flash,layers=4 --backend cuda"
for b in 16 8 16 1 16 8 64 16 1; do s=$((SECONDS % 100)); for g in gA gB; do n=${g}_b${b}_$s; { echo "\`$g/dsv4 $P --context 4096 --steps 20 --batch-size $b\`"; echo; } > $R/flash/$n.md; timeout 60 $g/dsv4 $P --context 4096 --steps 20 --batch-size $b >> $R/flash/$n.md 2>&1; echo "$n: $(grep -hE 'replayed step \(' $R/flash/$n.md | cut -c1-100) t=$((SECONDS - T0))"; done; done
(cd $R && tar czf flash2.tgz flash && rm -rf flash)
