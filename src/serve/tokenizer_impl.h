// Internals of Tokenizer shared by tokenizer.cpp (encode/decode) and tokenizer_load.cpp (reading
// tokenizer.json). Not part of the public interface.
#pragma once
#include <array>
#include <climits>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "serve/pretokenizer.h"
#include "serve/tokenizer.h"

namespace dsv4 {

// (left id, right id) -> (merge rank, merged id), open addressing: BPE looks pairs up in its
// innermost loop, where std::unordered_map's node chasing shows.
class MergeTable {
 public:
  struct Merge {
    int32_t rank = INT32_MAX;
    TokenId merged = -1;
  };
  void build(const std::vector<std::pair<uint64_t, Merge>>& entries);
  Merge find(TokenId left, TokenId right) const {
    const uint64_t key = pack(left, right);
    for (size_t slot = hash(key);; slot = (slot + 1) & mask_) {
      const uint64_t k = keys_[slot];
      if (k == key) return values_[slot];
      if (k == kEmpty) return {};
    }
  }
  static uint64_t pack(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  size_t hash(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  std::vector<uint64_t> keys_{kEmpty};
  std::vector<Merge> values_{Merge{}};
  size_t mask_ = 0;
  int shift_ = 63;
};

// Byte trie over added-token contents for leftmost-longest matching.
class AddedTokenTrie {
 public:
  void insert(std::string_view content, TokenId id);
  bool empty() const { return nodes_.size() == 1 && nodes_[0].children.empty(); }
  // Longest token starting at text[pos]: its id and length, or {-1, 0}.
  std::pair<TokenId, size_t> longest_match(std::string_view text, size_t pos) const;
  bool may_start(unsigned char byte) const { return first_byte_[byte]; }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    TokenId token = -1;
  };
  int32_t child(int32_t node, unsigned char byte) const;
  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> first_byte_{};
};

struct Tokenizer::Impl {
  // Added tokens matched on the raw text (pass 1) and on the gaps between them (pass 2).
  AddedTokenTrie raw_added_tokens, normalized_added_tokens;
  std::unordered_map<std::string, TokenId> added_token_ids;  // content -> id
  std::unordered_map<std::string, TokenId> vocab;            // byte-level token string -> id
  std::unordered_map<std::string, TokenId> vocab_by_bytes;   // raw bytes -> id (ignore_merges)
  std::vector<std::string> id_bytes;                         // what each id decodes to
  std::vector<uint8_t> id_known;
  std::array<TokenId, 256> byte_token{};
  MergeTable merges;
  bool ignore_merges = false;
  std::unique_ptr<PreTokenizer> pre_tokenizer;

  void encode_segment(std::string_view segment, PreTokenizer::Scratch& scratch,
                      std::vector<std::string_view>& pieces, std::vector<TokenId>& ids) const;
  void bpe(std::string_view piece, std::vector<TokenId>& ids) const;
  void bpe_short(std::string_view piece, std::vector<TokenId>& ids) const;
  void bpe_long(std::string_view piece, std::vector<TokenId>& ids) const;
};

// GPT-2's byte <-> printable character table used by ByteLevel.
const std::array<uint32_t, 256>& byte_level_chars();
// Raw bytes of a ByteLevel token string, or the string itself when a character is outside the
// byte alphabet (what Hugging Face's ByteLevel decoder does).
std::string byte_level_decode(std::string_view token);

}  // namespace dsv4
