// Tokenizer behaviour on small, hand-made tokenizer.json files and on bad input: invalid UTF-8
// (repaired to U+FFFD), malformed or truncated files and unsupported features (clear errors),
// unknown ids, and the streaming detokenizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "serve/detokenizer.h"
#include "serve/tokenizer.h"
#include "serve/utf8.h"

namespace dsv4 {
namespace {

using nlohmann::json;

std::string byte_char(int byte) {
  // GPT-2's byte alphabet, written out independently of the implementation.
  const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE && byte <= 0xFF);
  int cp = byte;
  if (!printable) {
    int extra = 0;
    for (int b = 0; b < byte; ++b)
      if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) ++extra;
    cp = 256 + extra;
  }
  std::string out;
  utf8::append_code_point(out, cp);
  return out;
}

// A byte-level BPE over all 256 bytes with nine merges (ids 256..264), DeepSeek's digit and
// letter/space regexes and two added tokens at 265 and 266 (one normalized, one matched raw).
json tiny_tokenizer_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}, {"Ġw", "o"}, {"r", "l"}, {"Ġwo", "rl"}, {"Ġworl", "d"}};
  json merge_lines = json::array();
  int next_id = 256;
  for (const auto& [left, right] : merges) {
    vocab[left + right] = next_id++;
    merge_lines.push_back(left + " " + right);
  }
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       {{{"id", 265}, {"content", "<｜User｜>"}, {"special", false}, {"normalized", true}},
        {{"id", 266}, {"content", "<think>"}, {"special", true}, {"normalized", false}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", "\\p{N}{1,3}"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "Split"},
           {"pattern", {{"Regex", "[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"vocab", vocab}, {"merges", merge_lines}}},
  };
}

Tokenizer tiny() { return Tokenizer::from_json(tiny_tokenizer_json(), "tiny"); }

TEST(Utf8, RepairFollowsMaximalSubparts) {
  EXPECT_EQ(utf8::repair("abc"), "abc");
  EXPECT_EQ(utf8::repair("\xF0\x90\x80" "A"), "\xEF\xBF\xBD" "A");         // truncated 4-byte: one U+FFFD
  EXPECT_EQ(utf8::repair("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");          // overlong: two
  EXPECT_EQ(utf8::repair("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate: three
  EXPECT_EQ(utf8::repair("\xFF"), "\xEF\xBF\xBD");
  EXPECT_EQ(utf8::incomplete_tail_length("a\xE4\xBD"), 2u);
  EXPECT_EQ(utf8::incomplete_tail_length("a\xE4\xBD\xA0"), 0u);
  EXPECT_EQ(utf8::incomplete_tail_length("a\xFF"), 0u);
  EXPECT_EQ(utf8::incomplete_tail_length("\xF0\x9F\x98"), 3u);
}

TEST(Tokenizer, MergesByRankAndMatchesAddedTokens) {
  const Tokenizer t = tiny();
  const TokenId hello = *t.token_to_id("hello"), world = *t.token_to_id("Ġworld");
  EXPECT_EQ(t.encode("hello world"), (std::vector<TokenId>{hello, world}));
  EXPECT_EQ(t.encode("<｜User｜>hello<think>"), (std::vector<TokenId>{265, hello, 266}));
  EXPECT_EQ(t.decode(std::vector<TokenId>{265, hello, world, 266}), "<｜User｜>hello world<think>");
  EXPECT_TRUE(t.encode("").empty());
  EXPECT_EQ(t.id_limit(), 267u);
}

TEST(Tokenizer, InvalidUtf8InputIsReplacedByReplacementCharacters) {
  const Tokenizer t = tiny();
  const std::string broken = "hello\xFF world\xE4\xBD";
  const std::vector<TokenId> ids = t.encode(broken);
  EXPECT_EQ(ids, t.encode(utf8::repair(broken)));
  EXPECT_EQ(t.decode(ids), "hello\xEF\xBF\xBD world\xEF\xBF\xBD");
}

TEST(Tokenizer, DecodeRepairsBytesThatDoNotFormCharacters) {
  const Tokenizer t = tiny();
  EXPECT_EQ(t.decode(std::vector<TokenId>{0xE4, 0xBD}), "\xEF\xBF\xBD");  // half a character
  EXPECT_EQ(t.decode(std::vector<TokenId>{0xE4, 0xBD, 0xA0}), "你");
}

TEST(Tokenizer, UnknownIdsAreErrors) {
  const Tokenizer t = tiny();
  for (TokenId bad : {267, 300, -1, 1 << 30}) {
    try {
      (void)t.decode(std::vector<TokenId>{1, bad});
      ADD_FAILURE() << "id " << bad << " decoded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
  }
}

void expect_load_error(const json& j, const std::string& needle) {
  try {
    (void)Tokenizer::from_json(j, "test.json");
    ADD_FAILURE() << "loaded; expected an error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test.json"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, UnsupportedFeaturesAreRefused) {
  json j = tiny_tokenizer_json();
  j["normalizer"] = {{"type", "NFC"}};
  expect_load_error(j, "normalizer 'NFC'");
  j = tiny_tokenizer_json();
  j["model"]["type"] = "WordPiece";
  expect_load_error(j, "model type 'WordPiece'");
  j = tiny_tokenizer_json();
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  expect_load_error(j, "behavior 'Removed'");
  j = tiny_tokenizer_json();
  j["pre_tokenizer"]["pretokenizers"][2]["use_regex"] = true;
  expect_load_error(j, "use_regex");
  j = tiny_tokenizer_json();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_load_error(j, "ByteLevel");
  j = tiny_tokenizer_json();
  j["added_tokens"][0]["lstrip"] = true;
  expect_load_error(j, "lstrip");
  j = tiny_tokenizer_json();
  j["model"]["byte_fallback"] = true;
  expect_load_error(j, "byte_fallback");
  j = tiny_tokenizer_json();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_load_error(j, "decoder 'WordPiece'");
  j = tiny_tokenizer_json();
  j["truncation"] = {{"max_length", 10}};
  expect_load_error(j, "truncation");
}

TEST(Tokenizer, InconsistentFilesAreRefused) {
  json j = tiny_tokenizer_json();
  j["model"]["merges"].push_back("q zz");
  expect_load_error(j, "'zz' is not in the vocabulary");
  j = tiny_tokenizer_json();
  j["model"]["merges"].push_back("nospace");
  expect_load_error(j, "is not 'left right'");
  j = tiny_tokenizer_json();
  j["model"]["vocab"].erase(byte_char('a'));
  expect_load_error(j, "byte 0x61");
  j = tiny_tokenizer_json();
  j["model"]["vocab"]["huge"] = int64_t{1} << 40;
  expect_load_error(j, "out of range");
  j = tiny_tokenizer_json();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  expect_load_error(j, "does not compile");
  j = tiny_tokenizer_json();
  j["model"]["vocab"] = json::array();
  expect_load_error(j, "model.vocab");
  j = tiny_tokenizer_json();
  j["added_tokens"].push_back({{"id", 310}, {"content", "<gap>"}});  // Hugging Face would number it 267
  expect_load_error(j, "would give it id 267");
  j = tiny_tokenizer_json();
  j["added_tokens"].push_back({{"id", 7}, {"content", "hello"}});  // already in the vocabulary at 259
  expect_load_error(j, "would give it id 259");
}

TEST(Tokenizer, MalformedAndTruncatedJsonIsAnErrorNotACrash) {
  const std::string text = tiny_tokenizer_json().dump();
  for (size_t cut : {size_t{0}, size_t{1}, text.size() / 7, text.size() / 2, text.size() - 1}) {
    try {
      (void)Tokenizer::from_json_text(text.substr(0, cut), "cut.json");
      ADD_FAILURE() << "truncated at " << cut << " loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cut.json"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW((void)Tokenizer::from_json_text("[1,2,3]", "list.json"), Error);
  EXPECT_THROW((void)Tokenizer::from_json_text("{\"model\": 5}", "odd.json"), Error);
  EXPECT_THROW((void)Tokenizer::load("/nonexistent/dir/for/the/test"), Error);
}

TEST(StreamingDetokenizer, HoldsBackSplitCharactersAndMatchesDecode) {
  const Tokenizer t = tiny();
  const std::string text = "hello 你好 😀 world";
  // Each byte is its own token here, so every character is split across tokens.
  std::vector<TokenId> ids;
  for (unsigned char c : text) ids.push_back(*t.token_to_id(byte_char(c)));
  StreamingDetokenizer stream(t);
  std::string streamed;
  for (TokenId id : ids) {
    const std::string piece = stream.push(id);
    EXPECT_TRUE(utf8::is_valid(piece));
    streamed += piece;
  }
  streamed += stream.finish();
  EXPECT_EQ(streamed, text);
}

TEST(StreamingDetokenizer, BrokenSequencesComeOutAsDecodeWouldRepairThem) {
  const Tokenizer t = tiny();
  const std::vector<std::vector<TokenId>> cases = {
      {0xE4, 0xBD, 'A'}, {0xF0, 0x9F, 0x98}, {0xFF, 0xE4}, {0xC0, 0x80, 0xE4, 0xBD, 0xA0, 0xED, 0xA0, 0x80}};
  for (const auto& ids : cases) {
    StreamingDetokenizer stream(t);
    std::string streamed;
    for (TokenId id : ids) streamed += stream.push(id);
    streamed += stream.finish();
    EXPECT_EQ(streamed, t.decode(ids));
  }
}

TEST(DefaultTokenizer, WritesALoadableTokenizerWithTheV4SpecialTokens) {
  const auto dir = std::filesystem::temp_directory_path() / "dsv4_tokenizer_test_out";
  std::filesystem::remove_all(dir);
  write_default_tokenizer(dir.string());
  const Tokenizer written = Tokenizer::load(dir.string());
  for (const SpecialTokenSpec& spec : deepseek_v4_special_tokens()) EXPECT_EQ(written.token_to_id(spec.content), spec.id);
  const std::string sample = "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>";
  EXPECT_EQ(written.encode(sample), (std::vector<TokenId>{128803, 30594, 128804, 128821, 36101, 128822, 7624, 1}));
  std::ifstream config_file(dir / "tokenizer_config.json");
  const json config = json::parse(config_file);
  EXPECT_EQ(config["add_bos_token"], false);
  EXPECT_EQ(config["bos_token"], "<｜begin▁of▁sentence｜>");
  std::filesystem::remove_all(dir);
}

TEST(DefaultTokenizer, RefusesAConflictingSpecialTokenId) {
  json j = tiny_tokenizer_json();
  j["added_tokens"].push_back({{"id", 128821}, {"content", "<other>"}});
  EXPECT_THROW(add_deepseek_v4_special_tokens(j), Error);
}

TEST(DefaultTokenizer, MissingFileNamedByTheEnvironmentIsAClearError) {
  setenv("DSV4_TOKENIZER_JSON", "/nonexistent/tokenizer.json", 1);
  try {
    (void)default_tokenizer_json_path();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DSV4_TOKENIZER_JSON"), std::string::npos) << e.what();
  }
  unsetenv("DSV4_TOKENIZER_JSON");
}

}  // namespace
}  // namespace dsv4
