#!/usr/bin/env bash
# Encode throughput on one core: the C++ tokenizer next to Hugging Face's tokenizer library (npm
# @anush008/tokenizers, through node), same corpus (tests/data/tokenizer/parity.jsonl), same run.
# Usage: scripts/tokenizer/bench.sh [build-dir] [seconds-per-measurement]
# Needs: scripts/setup.sh done, and `cmake --build BUILD --target tokenizer_bench`.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
seconds=${2:-3}
corpus=tests/data/tokenizer/parity.jsonl
bench="$build/tests/serve/tokenizer_bench"
[ -x "$bench" ] || { echo "bench: $bench missing; run: cmake --build $build --target tokenizer_bench" >&2; exit 1; }
core=$(( $(nproc) - 1 ))
pin=(taskset -c "$core")
command -v taskset >/dev/null || pin=()

cpp=$("${pin[@]}" "$bench" "$corpus" "$seconds")
hf=$(RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false "${pin[@]}" node scripts/tokenizer/bench_reference.mjs "$corpus" "$seconds")

field() { sed -E "s/.*\"$2\": ?([0-9.]+).*/\1/" <<<"$1"; }
echo "corpus: $corpus ($(field "$cpp" strings) strings, $(field "$cpp" bytes) bytes), one core (cpu $core): $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
printf '%-34s %18s %22s\n' "encoder" "per string (MB/s)" "whole corpus (MB/s)"
printf '%-34s %18s %22s\n' "dsv4 C++ (PCRE2 JIT)" "$(field "$cpp" per_string_mb_s)" "$(field "$cpp" whole_corpus_mb_s)"
printf '%-34s %18s %22s\n' "Hugging Face tokenizers (node)" "$(field "$hf" per_string_mb_s)" "$(field "$hf" whole_corpus_mb_s)"
