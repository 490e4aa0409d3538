// Reading a Hugging Face tokenizer.json into Tokenizer::Impl, refusing what is not implemented.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "serve/tokenizer_impl.h"
#include "serve/utf8.h"

namespace dsv4 {
namespace {

using nlohmann::json;

// Ids beyond this are surely a broken file; refusing them keeps a typo from allocating gigabytes.
constexpr int64_t kMaxTokenId = 1 << 24;

bool is_null_or_empty_string(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return true;
  return j[key].is_string() && j[key].get<std::string>().empty();
}

bool is_false_or_absent(const json& j, const char* key) {
  return !j.contains(key) || j[key].is_null() || (j[key].is_boolean() && !j[key].get<bool>());
}

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "?";
}

void check_normalizer(const json& normalizer) {
  if (normalizer.is_null()) return;
  // DeepSeek's file has an empty Sequence, which changes nothing.
  if (type_of(normalizer) == "Sequence" && normalizer.contains("normalizers") && normalizer["normalizers"].is_array() &&
      normalizer["normalizers"].empty())
    return;
  fail("normalizer '{}' is not supported (only none or an empty Sequence)", type_of(normalizer));
}

void check_byte_level(const json& byte_level) {
  if (!is_false_or_absent(byte_level, "add_prefix_space"))
    fail("pre_tokenizer ByteLevel with add_prefix_space=true is not supported");
  if (!is_false_or_absent(byte_level, "use_regex"))
    fail("pre_tokenizer ByteLevel with use_regex=true is not supported (use explicit Split regexes)");
}

// Split regexes of the pre-tokenizer; requires ByteLevel as the last step (BPE runs on bytes).
std::vector<std::string> read_pre_tokenizer(const json& pre) {
  if (pre.is_null()) fail("pre_tokenizer is missing; only byte-level BPE tokenizers are supported");
  std::vector<json> steps;
  if (type_of(pre) == "Sequence") {
    if (!pre.contains("pretokenizers") || !pre["pretokenizers"].is_array()) fail("pre_tokenizer Sequence has no 'pretokenizers' list");
    for (const json& step : pre["pretokenizers"]) steps.push_back(step);
  } else {
    steps.push_back(pre);
  }
  if (steps.empty() || type_of(steps.back()) != "ByteLevel")
    fail("pre_tokenizer must end with ByteLevel (only byte-level BPE tokenizers are supported)");
  check_byte_level(steps.back());
  std::vector<std::string> patterns;
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    const json& step = steps[i];
    if (type_of(step) != "Split") fail("pre_tokenizer step '{}' is not supported (only Split before ByteLevel)", type_of(step));
    const std::string behavior = step.value("behavior", "");
    if (behavior != "Isolated") fail("pre_tokenizer Split behavior '{}' is not supported (only Isolated)", behavior);
    if (!is_false_or_absent(step, "invert")) fail("pre_tokenizer Split with invert=true is not supported");
    const json& pattern = step.at("pattern");
    if (pattern.contains("Regex")) {
      patterns.push_back(pattern["Regex"].get<std::string>());
    } else if (pattern.contains("String")) {
      // A literal: quote every character so the regex engine matches it verbatim.
      std::string literal;
      for (char c : pattern["String"].get<std::string>()) {
        if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) literal += '\\';
        literal += c;
      }
      patterns.push_back(literal);
    } else {
      fail("pre_tokenizer Split pattern must be a Regex or a String");
    }
  }
  return patterns;
}

void check_model_options(const json& model) {
  if (type_of(model) != "BPE") fail("model type '{}' is not supported (only BPE)", type_of(model));
  if (model.contains("dropout") && !model["dropout"].is_null()) fail("BPE dropout is not supported");
  if (!is_null_or_empty_string(model, "continuing_subword_prefix")) fail("BPE continuing_subword_prefix is not supported");
  if (!is_null_or_empty_string(model, "end_of_word_suffix")) fail("BPE end_of_word_suffix is not supported");
  if (!is_false_or_absent(model, "byte_fallback")) fail("BPE byte_fallback is not supported");
}

TokenId checked_id(const json& value, std::string_view what) {
  if (!value.is_number_integer()) fail("{}: id is not an integer", what);
  const auto id = value.get<int64_t>();
  if (id < 0 || id >= kMaxTokenId) fail("{}: id {} is out of range", what, id);
  return static_cast<TokenId>(id);
}

void grow_to(Tokenizer::Impl& impl, TokenId id) {
  if (static_cast<size_t>(id) >= impl.id_known.size()) {
    impl.id_known.resize(id + 1, 0);
    impl.id_bytes.resize(id + 1);
  }
}

void read_vocab_and_merges(const json& model, Tokenizer::Impl& impl) {
  if (!model.contains("vocab") || !model["vocab"].is_object()) fail("model.vocab is missing or not an object");
  for (const auto& [token, id_value] : model["vocab"].items()) {
    const TokenId id = checked_id(id_value, fmt::format("model.vocab['{}']", token));
    impl.vocab[token] = id;
    grow_to(impl, id);
    impl.id_known[id] = 1;
    impl.id_bytes[id] = byte_level_decode(token);
    if (impl.ignore_merges) impl.vocab_by_bytes[impl.id_bytes[id]] = id;
  }
  const auto& chars = byte_level_chars();
  for (int b = 0; b < 256; ++b) {
    std::string one_char;
    utf8::append_code_point(one_char, chars[b]);
    auto it = impl.vocab.find(one_char);
    if (it == impl.vocab.end()) fail("model.vocab has no token for byte 0x{:02X} ('{}'); not a byte-level vocabulary", b, one_char);
    impl.byte_token[b] = it->second;
  }
  if (!model.contains("merges") || !model["merges"].is_array()) fail("model.merges is missing or not a list");
  const json& merges = model["merges"];
  std::vector<std::pair<uint64_t, MergeTable::Merge>> entries;
  entries.reserve(merges.size());
  auto lookup = [&](const std::string& token, size_t rank) {
    auto it = impl.vocab.find(token);
    if (it == impl.vocab.end()) fail("model.merges[{}]: token '{}' is not in the vocabulary", rank, token);
    return it->second;
  };
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& line = merges[rank];
    std::string left, right;
    if (line.is_string()) {
      const std::string text = line.get<std::string>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos)
        fail("model.merges[{}] '{}' is not 'left right'", rank, text);
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (line.is_array() && line.size() == 2 && line[0].is_string() && line[1].is_string()) {
      left = line[0].get<std::string>();
      right = line[1].get<std::string>();
    } else {
      fail("model.merges[{}] is neither 'left right' nor [left, right]", rank);
    }
    const TokenId left_id = lookup(left, rank), right_id = lookup(right, rank);
    const TokenId merged = lookup(left + right, rank);
    entries.push_back({MergeTable::pack(left_id, right_id), {static_cast<int32_t>(rank), merged}});
  }
  impl.merges.build(entries);
}

// Hugging Face ignores the ids written in added_tokens: a token already in the vocabulary keeps
// its id, any other gets the next id after the vocabulary and the added tokens before it. A file
// whose ids disagree would encode differently there; it is refused rather than reinterpreted.
TokenId id_hugging_face_assigns(const std::string& content, const Tokenizer::Impl& impl, size_t model_vocab_size,
                                TokenId& max_added_id) {
  if (auto it = impl.added_token_ids.find(content); it != impl.added_token_ids.end()) return it->second;
  if (auto it = impl.vocab.find(content); it != impl.vocab.end()) return it->second;
  const auto vocab_size = static_cast<TokenId>(model_vocab_size);
  return max_added_id >= vocab_size ? max_added_id + 1 : vocab_size;
}

void read_added_tokens(const json& added_tokens, Tokenizer::Impl& impl) {
  if (added_tokens.is_null()) return;
  if (!added_tokens.is_array()) fail("added_tokens is not a list");
  const size_t model_vocab_size = impl.vocab.size();
  TokenId max_added_id = -1;
  for (size_t i = 0; i < added_tokens.size(); ++i) {
    const json& token = added_tokens[i];
    const std::string where = fmt::format("added_tokens[{}]", i);
    if (!token.is_object() || !token.contains("content") || !token["content"].is_string() || !token.contains("id"))
      fail("{}: needs 'id' and 'content'", where);
    const std::string content = token["content"].get<std::string>();
    if (content.empty()) fail("{}: empty content", where);
    for (const char* rule : {"single_word", "lstrip", "rstrip"})
      if (!is_false_or_absent(token, rule)) fail("{} '{}': {}=true is not supported", where, content, rule);
    const TokenId id = checked_id(token["id"], where);
    const TokenId expected = id_hugging_face_assigns(content, impl, model_vocab_size, max_added_id);
    if (id != expected)
      fail("{} '{}' has id {}, but Hugging Face's library would give it id {} (new added tokens must follow the "
           "vocabulary and each other without gaps)", where, content, id, expected);
    max_added_id = std::max(max_added_id, id);
    grow_to(impl, id);
    impl.id_known[id] = 1;
    impl.id_bytes[id] = byte_level_decode(content);
    impl.added_token_ids[content] = id;
    const bool normalized = token.value("normalized", !token.value("special", false));
    (normalized ? impl.normalized_added_tokens : impl.raw_added_tokens).insert(content, id);
  }
}

}  // namespace

Tokenizer Tokenizer::from_json(const json& root, std::string_view origin) {
  try {
    if (!root.is_object()) fail("not a JSON object");
    if (root.contains("truncation") && !root["truncation"].is_null()) fail("truncation is not supported");
    // padding and post_processor only matter when special tokens are added around a sequence,
    // which this tokenizer never does (the chat format writes BOS explicitly).
    auto impl = std::make_unique<Impl>();
    check_normalizer(root.value("normalizer", json()));
    impl->pre_tokenizer = std::make_unique<PreTokenizer>(read_pre_tokenizer(root.value("pre_tokenizer", json())));
    const json decoder = root.value("decoder", json());
    if (type_of(decoder) != "ByteLevel") fail("decoder '{}' is not supported (only ByteLevel)", type_of(decoder));
    if (!root.contains("model")) fail("model is missing");
    const json& model = root["model"];
    check_model_options(model);
    impl->ignore_merges = !is_false_or_absent(model, "ignore_merges");
    read_vocab_and_merges(model, *impl);
    read_added_tokens(root.value("added_tokens", json()), *impl);
    return Tokenizer(std::move(impl));
  } catch (const json::exception& e) {
    fail("{}: unexpected tokenizer.json structure: {}", origin, e.what());
  } catch (const Error& e) {
    fail("{}: {}", origin, e.what());
  }
}

Tokenizer Tokenizer::from_json_text(std::string_view text, std::string_view origin) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON ({})", origin, e.what());
  }
  return from_json(root, origin);
}

Tokenizer Tokenizer::load(const std::string& path) {
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(file)) file /= "tokenizer.json";
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("cannot read tokenizer file {}", file.string());
  std::ostringstream text;
  text << in.rdbuf();
  return from_json_text(text.str(), file.string());
}

}  // namespace dsv4
