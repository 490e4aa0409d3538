// Every Unicode scalar value is classified by the C++ pre-tokenizer exactly as Hugging Face's
// pre-tokenizer classifies it (tests/data/tokenizer/unicode_classes.json, written by
// scripts/tokenizer/unicode_classes.mjs with the same probes). This is what keeps PCRE2's older
// Unicode tables (plus src/serve/unicode_patch.h) in line with the reference library.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "serve/pretokenizer.h"
#include "serve/utf8.h"
#include "tokenizer_test_util.h"

namespace dsv4 {
namespace {

using nlohmann::json;

std::vector<std::string> default_split_patterns() {
  std::ifstream in(default_tokenizer_json_path(), std::ios::binary);
  const json tokenizer = json::parse(in);
  std::vector<std::string> patterns;
  for (const json& step : tokenizer["pre_tokenizer"]["pretokenizers"])
    if (step["type"] == "Split") patterns.push_back(step["pattern"]["Regex"]);
  return patterns;
}

TEST(TokenizerUnicode, EveryCodePointIsClassifiedLikeHuggingFace) {
  const PreTokenizer pre_tokenizer(default_split_patterns());
  ASSERT_EQ(pre_tokenizer.pattern_count(), 3u);
  const auto scratch = pre_tokenizer.make_scratch();
  std::vector<std::string_view> pieces;
  auto piece_count = [&](const std::string& text) {
    pieces.clear();
    pre_tokenizer.split(text, *scratch, pieces);
    return pieces.size();
  };
  // The probe order is the one of scripts/tokenizer/unicode_classes.mjs.
  auto classify = [&](const std::string& ch) {
    if (piece_count(ch + ch + ch + ch) == 2) return 'N';
    if (piece_count("a" + ch) == 1) return 'A';
    if (piece_count("!" + ch) == 1) return 'C';
    if (piece_count(ch + "\n") == 1) return 'W';
    return '-';
  };
  std::vector<char> expected(0x110000, '-');
  const json classes = json::parse(testing::read_test_file("tokenizer/unicode_classes.json"));
  for (const json& range : classes["ranges"])
    for (uint32_t cp = range[0]; cp <= range[1].get<uint32_t>(); ++cp) expected[cp] = range[2].get<std::string>()[0];
  size_t differences = 0;
  for (uint32_t cp = 0; cp < 0x110000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string ch;
    utf8::append_code_point(ch, cp);
    const char got = classify(ch);
    if (got != expected[cp] && ++differences <= 20)
      ADD_FAILURE() << fmt::format("U+{:04X}: Hugging Face class '{}', ours '{}'", cp, expected[cp], got);
  }
  EXPECT_EQ(differences, 0u);
}

}  // namespace
}  // namespace dsv4
