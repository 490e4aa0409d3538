#!/usr/bin/env bash
# DeepSeek-V4-Flash at full size split over GPUs (tensor parallel, then with --expert-parallel):
# `dsv4 profile` of the decode step at batch 1, 16 and 64 (4K context; rank 0's ops with the
# all-reduces), `dsv4 bench latency` at the same batches, then `dsv4 bench sweep` against
# `dsv4 serve --tensor-parallel-size N` (scripts/run_measure.sh). One markdown file per run in
# OUT, with its command; the results tarred into OUT.tgz at the end.
# Usage: scripts/measure_tp.sh OUT [ranks (2)] [model (synthetic:flash)]
#   DSV4: the binary (build/src/dsv4); BATCHES ("1 16 64"); SPLITS ("tp ep"); SKIP_SWEEP=1.
#   NCCL: $DSV4_NCCL_LIBRARY, else the loader's path, else the first libnccl.so.2 under /usr or /opt.
set -uo pipefail
out=${1:?usage: scripts/measure_tp.sh OUT [ranks] [model]}
ranks=${2:-2}
model=${3:-synthetic:flash}
dsv4=${DSV4:-build/src/dsv4}
mkdir -p "$out"
source "$(dirname "$0")/nccl-env.sh"
echo "measure_tp: NCCL from ${DSV4_NCCL_LIBRARY:-the loader path}" | tee "$out/nccl.txt"
nvidia-smi topo -m >"$out/topology.txt" 2>&1 || true

run() {  # run NAME ARGS...: stdout to OUT/NAME.md (the command first), stderr to OUT/NAME.log
  local name=$1
  shift
  { echo "\`$*\`"; echo; } >"$out/$name.md"
  "$@" >>"$out/$name.md" 2>"$out/$name.log"
  echo "measure_tp: $name rc $?"
}

for split in ${SPLITS:-tp ep}; do
  opts=(--tensor-parallel-size "$ranks")
  [ "$split" = ep ] && opts+=(--expert-parallel)
  for b in ${BATCHES:-1 16 64}; do
    run "profile_${split}_b$b" "$dsv4" profile --model "$model" --backend cuda "${opts[@]}" --batch-size "$b" \
      --context 4096 --steps 10
    run "latency_${split}_b$b" "$dsv4" bench latency --model "$model" --backend cuda "${opts[@]}" --batch-size "$b" \
      --input-len 4096 --output-len 64 --num-iters-warmup 1 --num-iters 3 --no-table
  done
done

if [ "${SKIP_SWEEP:-0}" != 1 ]; then
  DSV4="$dsv4" RESULTS="$out/sweep" \
    SWEEP_ARGS="${SWEEP_ARGS:---no-gate --concurrency 1,8,16,64 --num-prompts 8,32,48,64 --random-input-len 512 --random-output-len 64}" \
    scripts/run_measure.sh "tp$ranks" --model "$model" --backend cuda --max-model-len 4096 --tensor-parallel-size "$ranks" \
    >"$out/sweep.log" 2>&1
  echo "measure_tp: sweep rc $?"
fi
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
echo "measure_tp: $out.tgz"
