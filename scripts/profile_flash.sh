#!/usr/bin/env bash
# DeepSeek-V4-Flash on one GPU from synthetic full-size layers: `dsv4 profile` of the decode step
# at batch 1, 16 and 64 (4K context), of one 8,192-token prefill, and the load of a full-size
# checkpoint written to disk (make-tiny --like). One markdown file per run in OUT, with its command.
# Usage: scripts/profile_flash.sh OUT [layers (4)] [disk layers (2)]
#   DSV4: the binary (build/src/dsv4); CKPT: where the on-disk checkpoint goes (/tmp/dsv4-flash-ckpt,
#   removed afterwards); BATCHES ("1 16 64"); SKIP_PREFILL=1, SKIP_LOAD=1 skip those parts.
set -euo pipefail
out=${1:?usage: scripts/profile_flash.sh OUT [layers] [disk layers]}
layers=${2:-4}
disk_layers=${3:-2}
dsv4=${DSV4:-build/src/dsv4}
ckpt=${CKPT:-/tmp/dsv4-flash-ckpt}
mkdir -p "$out"
model="synthetic:flash,layers=$layers"

run() {  # run NAME ARGS...: stdout to OUT/NAME.md (the command first), stderr to OUT/NAME.log
  local name=$1
  shift
  { echo "\`$*\`"; echo; } >"$out/$name.md"
  "$@" >>"$out/$name.md" 2>"$out/$name.log"
  echo "profile_flash: $name done"
}

for b in ${BATCHES:-1 16 64}; do
  run "decode_b$b" "$dsv4" profile --model "$model" --backend cuda --batch-size "$b" --context 4096 --steps 20
done
[ "${SKIP_PREFILL:-0}" = 1 ] || run prefill_8192 "$dsv4" profile --model "$model" --backend cuda --prefill 8192 --steps 3

if [ "${SKIP_LOAD:-0}" != 1 ]; then
  rm -rf "$ckpt"
  /usr/bin/time -v "$dsv4" make-tiny --like "synthetic:flash,layers=$disk_layers" --out "$ckpt" --no-tokenizer \
    >"$out/write_checkpoint.log" 2>&1
  du -sb "$ckpt" >>"$out/write_checkpoint.log"
  sync
  if (echo 3 >/proc/sys/vm/drop_caches) 2>/dev/null; then cache="page cache dropped before the load"
  else cache="page cache NOT dropped (no permission): the shards may be read from memory"; fi
  # The load's progress bar is drawn on a terminal only: `script` gives the command one.
  cmd="$dsv4 generate --model $ckpt --backend cuda --prompt-ids 5,6,7 -n 4"
  { echo "\`$cmd\` ($cache)"; echo; } >"$out/load.md"
  if command -v script >/dev/null; then script -qfec "$cmd" /dev/null >>"$out/load.md" 2>&1
  else $cmd >>"$out/load.md" 2>&1; fi
  # What the disk itself gives: the same shards read cold with nothing else (when the cache drops).
  if (echo 3 >/proc/sys/vm/drop_caches) 2>/dev/null; then
    t0=$(date +%s.%N)
    cat "$ckpt"/*.safetensors >/dev/null
    t1=$(date +%s.%N)
    bytes=$(du -cb "$ckpt"/*.safetensors | tail -1 | cut -f1)
    awk -v a="$t0" -v b="$t1" -v n="$bytes" \
      'BEGIN { printf "disk read, cold: %d bytes in %.2f s = %.2f GB/s (cat)\n", n, b - a, n / (b - a) / 1e9 }' >>"$out/load.md"
  fi
  rm -rf "$ckpt"
  echo "profile_flash: load done"
fi
