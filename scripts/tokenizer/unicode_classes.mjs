// Classifies every Unicode scalar value the way Hugging Face's pre-tokenizer for DeepSeek's
// tokenizer.json sees it, and writes the result as code-point ranges. The C++ tokenizer's test
// classifies every code point with the same probes through its own pre-tokenizer and must agree:
// this is how differences between the Unicode tables of PCRE2 and of the regex engine inside
// Hugging Face's library are found (and why src/serve/pretokenizer.cpp carries a patch list).
//
// Classes (the only distinctions the DeepSeek-V3/V4 split regexes can observe):
//   N  numbers (\p{N}), A  letters and marks (\p{L} or \p{M}), C  punctuation and symbols
//   (\p{P} or \p{S}), W  white space (\s), and everything else (not written).
//
// Usage (run by hand after scripts/setup.sh):
//   node scripts/tokenizer/unicode_classes.mjs TOKENIZER_JSON > tests/data/tokenizer/unicode_classes.json
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '../../tools/npm/package.json'));
const { Tokenizer } = require('@anush008/tokenizers');

const tokenizerJson = process.argv[2];
if (!tokenizerJson) {
  console.error('usage: unicode_classes.mjs TOKENIZER_JSON');
  process.exit(2);
}
const preTokenizer = Tokenizer.fromFile(tokenizerJson).getPreTokenizer();
const pieces = (s) => preTokenizer.preTokenizeString(s).length;

// The probe order matters; it is mirrored in tests/serve/tokenizer_unicode_test.cpp.
function classify(ch) {
  if (pieces(ch.repeat(4)) === 2) return 'N';
  if (pieces('a' + ch) === 1) return 'A';
  if (pieces('!' + ch) === 1) return 'C';
  if (pieces(ch + '\n') === 1) return 'W';
  return null;
}

const ranges = [];
for (let cp = 0; cp <= 0x10ffff; ++cp) {
  if (cp >= 0xd800 && cp <= 0xdfff) continue;
  const cls = classify(String.fromCodePoint(cp));
  if (cls === null) continue;
  const last = ranges[ranges.length - 1];
  if (last && last[2] === cls && last[1] === cp - 1) last[1] = cp;
  else ranges.push([cp, cp, cls]);
}
process.stdout.write('{"ranges":[\n' + ranges.map((r) => JSON.stringify(r)).join(',\n') + '\n]}\n');
