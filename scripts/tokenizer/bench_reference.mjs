// Encode throughput of Hugging Face's tokenizer library (through its Node binding) over the parity
// corpus; the counterpart of tests/serve/tokenizer_bench.cpp. Run through scripts/tokenizer/bench.sh,
// which pins it to one core (RAYON_NUM_THREADS=1 keeps the library itself on one thread too).
//   node scripts/tokenizer/bench_reference.mjs [PARITY_JSONL] [SECONDS]
import fs from 'node:fs';
import path from 'node:path';
import { loadReferenceTokenizer, repoRoot } from './reference_tokenizer.mjs';

const file = process.argv[2] ?? path.join(repoRoot, 'tests/data/tokenizer/parity.jsonl');
const seconds = Number(process.argv[3] ?? 3);
const lines = fs.readFileSync(file, 'utf8').trim().split('\n').slice(1);
const texts = lines.map((line) => JSON.parse(line).text);
const bytes = texts.reduce((sum, t) => sum + Buffer.byteLength(t, 'utf8'), 0);
const joined = texts.join('');
const tokenizer = loadReferenceTokenizer();
const options = { addSpecialTokens: false };

async function throughput(bytesPerPass, pass) {
  await pass();
  let passes = 0;
  const start = process.hrtime.bigint();
  let elapsed = 0;
  while (passes < 2 || elapsed < seconds) {
    await pass();
    ++passes;
    elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  }
  return (bytesPerPass * passes) / elapsed / 1e6;
}

let sink = 0;
const perString = await throughput(bytes, async () => {
  for (const text of texts) sink += (await tokenizer.encode(text, null, options)).getLength();
});
const whole = await throughput(bytes, async () => {
  sink += (await tokenizer.encode(joined, null, options)).getLength();
});
console.log(JSON.stringify({
  strings: texts.length, bytes, per_string_mb_s: +perString.toFixed(2), whole_corpus_mb_s: +whole.toFixed(2), sink: sink % 10,
}));
