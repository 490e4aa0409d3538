// The tokenizer test corpus: hand-written samples plus strings generated from a seeded PRNG, so
// every run produces the same strings. Used for the parity vectors and the encode benchmark.
import { deepseekV4SpecialTokens } from './reference_tokenizer.mjs';

// Mulberry32: tiny, seedable, good enough to shuffle test strings.
function makeRandom(seed) {
  let state = seed >>> 0;
  const next = () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (lo, hi) => lo + Math.floor(next() * (hi - lo + 1));
  const pick = (list) => list[int(0, list.length - 1)];
  return { next, int, pick };
}

const englishWords = (
  'the of and to in is was for that with as on by at from his her it an were are which this be ' +
  'has had have not but they their one all been more when there who would can will also other ' +
  'time after new first may about some into only then these over its most could than world years ' +
  'model token engine memory kernel latency throughput attention expert router cache prefill decode ' +
  'quantization gradient tensor matrix vector batch stream server request response client socket ' +
  "don't it's we're they've I'm you'll she'd O'Brien co-operate state-of-the-art e.g. i.e. U.S.A. " +
  'Hello World OpenAI DeepSeek GPU CUDA HTTP JSON NASA iPhone McDonald naïve café résumé façade'
).split(' ');

const chineseText =
  '人工智能正在改变世界的面貌。深度学习模型通过大量数据进行训练，能够理解自然语言、识别图像并生成文本。' +
  '北京是中国的首都，有着悠久的历史和灿烂的文化。今天天气很好，我们一起去公园散步吧！' +
  '机器学习是计算机科学的一个分支，它研究如何让计算机从经验中学习。「你好」，他说：“欢迎光临”。' +
  '龘靐齉爨麤鱻，生僻字也要正确处理；数字１２３和全角字母ＡＢＣ也常见。';
const japaneseText =
  '今日は良い天気ですね。東京タワーに行きましょう！カタカナとひらがなと漢字が混ざっています。' +
  'ソフトウェアエンジニアはコードを書きます。ｶﾀｶﾅ（半角）もあります。ー〜・「」';
const koreanText =
  '안녕하세요, 반갑습니다. 오늘 날씨가 정말 좋네요. 한국어 형태소 분석은 어렵습니다. ' +
  '서울특별시 강남구 테헤란로 123, 대한민국. ㄱㄴㄷㄹ ㅏㅑㅓㅕ';
const arabicText =
  'مرحبا بالعالم! اللغة العربية جميلة جداً. الذكاء الاصطناعي يغير العالم. ' +
  'قال: «السلام عليكم» ١٢٣٤٥٦٧٨٩٠ وَالْحُرُوفُ الْمُشَكَّلَةُ';
const otherScripts = [
  'Привет, мир! Съешь же ещё этих мягких французских булок, да выпей чаю.',
  'Γειά σου Κόσμε! Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.',
  'שלום עולם! עברית נכתבת מימין לשמאל.',
  'नमस्ते दुनिया! हिन्दी देवनागरी लिपि में लिखी जाती है। १२३',
  'สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ',
  'Tiếng Việt có nhiều dấu: ắ ằ ẳ ẵ ặ ế ề ể ễ ệ.',
  'Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.',
  'ᚠᛇᚻ᛫ᛒᛦᚦ ᚠᚱᚩᚠᚢᚱ — 𐌰𐌱𐌲 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕸𝖆𝖙𝖍 ∮ E⋅da = Q, n → ∞, ∑ f(i) = ∏ g(i)',
  'e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937 Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319',
];

const emoji = [
  '😀', '🎉', '🚀', '❤️', '👍🏽', '🇺🇸', '🇯🇵', '🏳️‍🌈', '👨‍👩‍👧‍👦', '👩🏾‍💻', '🧑‍🤝‍🧑', '🤷‍♂️', '☕', '✅',
  '🫠', '🫶🏻', '🪿', '🥹', '🐈‍⬛', '❤️‍🔥', '😶‍🌫️', '🏴‍☠️', '🏴󠁧󠁢󠁳󠁣󠁴󠁿', '#️⃣', '1️⃣', '©️', '™', '↔️', '🀄', '🃏',
];

const codeSamples = [
  '#include <vector>\nint main() {\n    std::vector<int> v{1, 2, 3};\n    for (auto& x : v) x *= 2;\n    return v[0] == 2 ? 0 : 1;\n}\n',
  'def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\nprint(fib(30))\n',
  "const add = (a, b) => a + b;\nexport default async function main() {\n  const r = await fetch('/api?q=1&x=%20');\n  console.log(`${r.status}`);\n}\n",
  'fn main() {\n    let s: String = "héllo".to_owned();\n    println!("{:?} {}", s.chars().rev().collect::<String>(), s.len());\n}\n',
  'package main\n\nimport "fmt"\n\nfunc main() {\n\tch := make(chan int, 3)\n\tgo func() { ch <- 42 }()\n\tfmt.Println(<-ch)\n}\n',
  'SELECT u.id, COUNT(*) AS n\nFROM users u\nJOIN orders o ON o.user_id = u.id\nWHERE o.created_at >= \'2024-01-01\'\nGROUP BY u.id\nHAVING n > 10;\n',
  '<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8"><title>Test &amp; demo</title></head>\n<body><p class="x">Hi&nbsp;there</p></body>\n</html>\n',
  '{"name": "dsv4", "version": "0.1.0", "tags": ["llm", "inference"], "ok": true, "pi": 3.14159, "nested": {"a": null}}',
  '#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -l "$f" | awk \'{print $1}\' >> counts.log 2>&1\ndone\n',
  '\\begin{equation}\n  E = mc^2 \\quad \\int_0^\\infty e^{-x^2} dx = \\frac{\\sqrt{\\pi}}{2}\n\\end{equation}\n',
  'x = [i**2 for i in range(10) if i % 2 == 0]  # squares\r\ny = {k: v for k, v in zip("abc", (1, 2, 3))}\r\n',
  '    public static void main(String[] args) throws IOException {\n        Map<String, List<Integer>> m = new HashMap<>();\n    }\n',
];

const whitespacePieces = [' ', '  ', '   ', '    ', '\t', '\t\t', '\n', '\n\n', '\r', '\r\n', '\r\n\r\n', ' \n', '\n ',
  '\u00a0', '\u3000', '\u2003', '\u0085', '\u2028', '\u200b', '\u000b', '\u000c', ' \t \n'];

// Ranges the noise generator draws from: scripts, symbols, marks, emoji, recent Unicode additions
// (where the regex engines' tables differ) and control characters.
const noiseRanges = [
  [0x20, 0x7e], [0x20, 0x7e], [0x20, 0x7e], [0x00, 0x1f], [0x7f, 0xff], [0x100, 0x24f], [0x300, 0x36f],
  [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x5ff], [0x600, 0x6ff], [0x900, 0x97f], [0xe00, 0xe7f],
  [0x1100, 0x11ff], [0x2000, 0x206f], [0x2070, 0x209f], [0x20a0, 0x20cf], [0x2100, 0x214f], [0x2190, 0x21ff],
  [0x2200, 0x22ff], [0x2500, 0x257f], [0x2600, 0x26ff], [0x2e80, 0x2fdf], [0x3000, 0x303f], [0x3040, 0x30ff],
  [0x4e00, 0x9fff], [0xac00, 0xd7a3], [0xe000, 0xe0ff], [0xfe00, 0xfe0f], [0xff00, 0xffef], [0x10000, 0x1007f],
  [0x10d40, 0x10d8f], [0x11f00, 0x11f5f], [0x1d400, 0x1d7ff], [0x1f300, 0x1f5ff], [0x1f600, 0x1f64f],
  [0x1f900, 0x1faff], [0x1fb00, 0x1fbff], [0x20000, 0x2a6df], [0x31350, 0x323af], [0xe0000, 0xe007f],
];

function noiseChar(rnd) {
  const [lo, hi] = rnd.pick(noiseRanges);
  return String.fromCodePoint(rnd.int(lo, hi));
}

function englishSentence(rnd) {
  const n = rnd.int(3, 25);
  const words = [];
  for (let i = 0; i < n; ++i) words.push(rnd.pick(englishWords));
  let s = words.join(' ');
  s = s[0].toUpperCase() + s.slice(1);
  return s + rnd.pick(['.', '!', '?', '...', ';', ':', ' —', '.\n', '?!', '."']);
}

function sliceOf(rnd, text, minLen, maxLen) {
  const chars = Array.from(text);
  const len = Math.min(chars.length, rnd.int(minLen, maxLen));
  const start = rnd.int(0, chars.length - len);
  return chars.slice(start, start + len).join('');
}

function digits(rnd, length) {
  let s = '';
  for (let i = 0; i < length; ++i) s += String.fromCharCode(48 + rnd.int(0, 9));
  return s;
}

const specialTokenStrings = [
  '<｜begin▁of▁sentence｜>', '<｜end▁of▁sentence｜>', '<｜▁pad▁｜>', '<｜User｜>', '<｜Assistant｜>', '<|EOT|>',
  '<｜tool▁calls▁begin｜>', '<｜tool▁call▁begin｜>', '<｜tool▁sep｜>', '<｜tool▁call▁end｜>', '<｜fim▁hole｜>',
  '<｜place▁holder▁no▁17｜>', ...deepseekV4SpecialTokens.map(([content]) => content),
  '<｜DSML｜tool_calls>', '</｜DSML｜invoke>', '<｜User', '｜>', '<think', 'think>', '</think', '<｜', '▁',
];

function generators(rnd) {
  return {
    english: () => Array.from({ length: rnd.int(1, 6) }, () => englishSentence(rnd)).join(' '),
    chinese: () => sliceOf(rnd, chineseText, 1, 120),
    japanese: () => sliceOf(rnd, japaneseText, 1, 80),
    korean: () => sliceOf(rnd, koreanText, 1, 80),
    arabic: () => sliceOf(rnd, arabicText, 1, 90),
    other_scripts: () => sliceOf(rnd, rnd.pick(otherScripts), 1, 90),
    mixed_language: () => [englishSentence(rnd), sliceOf(rnd, chineseText, 2, 30), sliceOf(rnd, japaneseText, 2, 20),
      sliceOf(rnd, koreanText, 2, 20)].sort(() => rnd.next() - 0.5).join(rnd.pick(['', ' ', '\n', '，'])),
    emoji: () => Array.from({ length: rnd.int(1, 12) },
      () => rnd.pick(emoji) + rnd.pick(['', '', ' ', 'a', '1', '!', '\u200d', '\ufe0f'])).join(''),
    code: () => {
      const sample = rnd.pick(codeSamples);
      return rnd.next() < 0.5 ? sample : sample.slice(rnd.int(0, sample.length >> 1));
    },
    digits: () => rnd.pick([
      () => digits(rnd, rnd.int(1, 200)),
      () => `${digits(rnd, rnd.int(1, 6))}.${digits(rnd, rnd.int(1, 9))}`,
      () => `${rnd.int(1, 999)},${digits(rnd, 3)},${digits(rnd, 3)}`,
      () => `v${rnd.int(0, 20)}.${rnd.int(0, 99)}.${rnd.int(0, 999)}-rc${rnd.int(1, 9)}`,
      () => `Call +1 (${digits(rnd, 3)}) ${digits(rnd, 3)}-${digits(rnd, 4)} before ${rnd.int(1, 12)}:${digits(rnd, 2)}pm`,
      () => `０１２３４５６７８９ ٠١٢٣٤٥٦٧٨٩ ${digits(rnd, rnd.int(1, 40))} ½ ² ³ Ⅻ ⑳`,
      () => `${digits(rnd, rnd.int(1, 30))}abc${digits(rnd, rnd.int(1, 30))}`,
    ])(),
    whitespace: () => Array.from({ length: rnd.int(1, 14) },
      () => rnd.pick([...whitespacePieces, ...whitespacePieces, 'word', 'x', '.', '中文', '1', '"', '-'])).join(''),
    special_tokens: () => Array.from({ length: rnd.int(1, 8) },
      () => rnd.pick([...specialTokenStrings, englishSentence(rnd), sliceOf(rnd, chineseText, 1, 8), ' ', '\n', '<', '>'])).join(''),
    long_word: () => rnd.pick([
      () => rnd.pick(['a', 'ab', 'xyz', 'é', '中', 'ー', '0', '!', ' ', '\n', '😀', 'ا']).repeat(rnd.int(50, 3000)),
      () => Array.from({ length: rnd.int(100, 4000) }, () => String.fromCharCode(97 + rnd.int(0, 25))).join(''),
      () => 'https://example.com/' + Array.from({ length: rnd.int(20, 200) }, () => rnd.pick(['a', 'b', '/', '?', '=', '&', '%2F', '-', '_', '1'])).join(''),
      () => Array.from({ length: rnd.int(100, 2000) }, () => rnd.pick('ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/')).join('') + '==',
      () => 'Pneumonoultramicroscopicsilicovolcanoconiosis'.repeat(rnd.int(1, 40)),
    ])(),
    noise: () => Array.from({ length: rnd.int(1, 200) }, () => noiseChar(rnd)).join(''),
  };
}

const handWritten = [
  '', ' ', '\n', '\r\n', '\t', 'a', 'A', '1', '!', '中', '😀', '\u0000', '\u007f', '\u00a0', '\u0085',
  'Hello world', 'Hello, world!', ' Hello', 'Hello ', '  leading and trailing  ', 'multiple   spaces   here',
  'Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ',
  '<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>',
  '<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>Hello<｜Assistant｜></think>Hi there! How can I help you?<｜end▁of▁sentence｜>',
  "I'm can't won't we'll they're it's he'd",
  '12345678901234567890', '3.14159265358979', '1,000,000', '2024-06-01T12:34:56Z',
  'line1\nline2\r\nline3\rline4', 'tab\tseparated\tvalues\n1\t2\t3',
  '!!!???...', '((([[[{{{}}}]]])))', '--- *** ___ ===', '"quoted" \'single\' `backtick`',
  'email@example.com https://www.example.org/path?query=1#frag',
  'The quick brown fox jumps over the lazy dog. 1234567890',
];

export function buildCorpus() {
  const rnd = makeRandom(20240601);
  const gens = generators(rnd);
  // Count per category; long words are few (they are large).
  const plan = {
    english: 260, chinese: 200, japanese: 120, korean: 100, arabic: 100, other_scripts: 100, mixed_language: 100,
    emoji: 150, code: 150, digits: 150, whitespace: 180, special_tokens: 180, long_word: 40, noise: 250,
  };
  const corpus = handWritten.map((text) => ({ category: 'hand_written', text }));
  for (const [category, count] of Object.entries(plan)) {
    for (let i = 0; i < count; ++i) corpus.push({ category, text: gens[category]() });
  }
  return corpus;
}
