// Encoding and decoding; loading lives in tokenizer_load.cpp.
#include <algorithm>
#include <queue>

#include "core/error.h"
#include "serve/tokenizer_impl.h"
#include "serve/utf8.h"

namespace dsv4 {

// --- byte-level alphabet ---------------------------------------------------------------------

const std::array<uint32_t, 256>& byte_level_chars() {
  static const std::array<uint32_t, 256> table = [] {
    // Printable Latin-1 bytes stand for themselves; the rest map to U+0100.. in byte order.
    std::array<uint32_t, 256> chars{};
    uint32_t next_extra = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      chars[b] = printable ? b : next_extra++;
    }
    return chars;
  }();
  return table;
}

std::string byte_level_decode(std::string_view token) {
  static const std::array<int16_t, 512> byte_of_char = [] {
    std::array<int16_t, 512> inverse{};
    inverse.fill(-1);
    const auto& chars = byte_level_chars();
    for (int b = 0; b < 256; ++b) inverse[chars[b]] = static_cast<int16_t>(b);
    return inverse;
  }();
  std::string bytes;
  size_t pos = 0;
  while (pos < token.size()) {
    if (utf8::valid_sequence_length(token, pos) == 0) return std::string(token);
    const uint32_t cp = utf8::next_code_point(token, pos);
    if (cp >= byte_of_char.size() || byte_of_char[cp] < 0) return std::string(token);
    bytes.push_back(static_cast<char>(byte_of_char[cp]));
  }
  return bytes;
}

// --- merge table ------------------------------------------------------------------------------

void MergeTable::build(const std::vector<std::pair<uint64_t, Merge>>& entries) {
  size_t capacity = 16;
  shift_ = 60;
  while (capacity < entries.size() * 2) {
    capacity *= 2;
    --shift_;
  }
  keys_.assign(capacity, kEmpty);
  values_.assign(capacity, Merge{});
  mask_ = capacity - 1;
  for (const auto& [key, merge] : entries) {
    size_t slot = hash(key);
    while (keys_[slot] != kEmpty && keys_[slot] != key) slot = (slot + 1) & mask_;
    keys_[slot] = key;  // a repeated pair keeps the later line, as Hugging Face's map insert does
    values_[slot] = merge;
  }
}

// --- added-token trie -------------------------------------------------------------------------

int32_t AddedTokenTrie::child(int32_t node, unsigned char byte) const {
  const auto& children = nodes_[node].children;
  auto it = std::lower_bound(children.begin(), children.end(), byte,
                             [](const auto& edge, unsigned char b) { return edge.first < b; });
  return it != children.end() && it->first == byte ? it->second : -1;
}

void AddedTokenTrie::insert(std::string_view content, TokenId id) {
  first_byte_[static_cast<unsigned char>(content[0])] = true;
  int32_t node = 0;
  for (char c : content) {
    const auto byte = static_cast<unsigned char>(c);
    int32_t next = child(node, byte);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.push_back(Node{});
      auto& children = nodes_[node].children;
      children.insert(std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{0})),
                      {byte, next});
    }
    node = next;
  }
  nodes_[node].token = id;
}

std::pair<TokenId, size_t> AddedTokenTrie::longest_match(std::string_view text, size_t pos) const {
  std::pair<TokenId, size_t> best{-1, 0};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    node = child(node, static_cast<unsigned char>(text[i]));
    if (node < 0) break;
    if (nodes_[node].token >= 0) best = {nodes_[node].token, i + 1 - pos};
  }
  return best;
}

// --- BPE --------------------------------------------------------------------------------------

namespace {
// Pieces up to this many bytes use the array merge loop (O(n^2) worst case, fastest for words);
// longer ones the heap over a linked list, as Hugging Face does, so a megabyte word stays linear-ish.
constexpr size_t kShortPieceBytes = 64;
}  // namespace

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<TokenId>& ids) const {
  if (piece.size() == 1) {
    ids.push_back(byte_token[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (ignore_merges) {
    if (auto it = vocab_by_bytes.find(std::string(piece)); it != vocab_by_bytes.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  if (piece.size() <= kShortPieceBytes) bpe_short(piece, ids);
  else bpe_long(piece, ids);
}

void Tokenizer::Impl::bpe_short(std::string_view piece, std::vector<TokenId>& ids) const {
  const size_t n = piece.size();
  TokenId symbols[kShortPieceBytes];
  MergeTable::Merge pairs[kShortPieceBytes];  // pairs[i] merges symbols[i] and symbols[i + 1]
  for (size_t i = 0; i < n; ++i) symbols[i] = byte_token[static_cast<unsigned char>(piece[i])];
  for (size_t i = 0; i + 1 < n; ++i) pairs[i] = merges.find(symbols[i], symbols[i + 1]);
  size_t count = n;
  while (count > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < count; ++i)
      if (pairs[i].rank < pairs[best].rank) best = i;  // strict: leftmost wins ties
    if (pairs[best].rank == INT32_MAX) break;
    symbols[best] = pairs[best].merged;
    std::copy(symbols + best + 2, symbols + count, symbols + best + 1);
    std::copy(pairs + best + 1, pairs + count - 1, pairs + best);
    --count;
    if (best + 1 < count) pairs[best] = merges.find(symbols[best], symbols[best + 1]);
    if (best > 0) pairs[best - 1] = merges.find(symbols[best - 1], symbols[best]);
  }
  ids.insert(ids.end(), symbols, symbols + count);
}

void Tokenizer::Impl::bpe_long(std::string_view piece, std::vector<TokenId>& ids) const {
  struct Symbol {
    TokenId id;
    int32_t prev, next;
  };
  struct Candidate {
    int32_t rank, pos;
    TokenId merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const auto n = static_cast<int32_t>(piece.size());
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) symbols[i] = {byte_token[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};
  std::vector<Candidate> storage;
  storage.reserve(n);
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue(std::greater<>{}, std::move(storage));
  auto push_pair = [&](int32_t left) {
    if (left < 0 || symbols[left].next < 0) return;
    const MergeTable::Merge m = merges.find(symbols[left].id, symbols[symbols[left].next].id);
    if (m.rank != INT32_MAX) queue.push({m.rank, left, m.merged});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.id < 0 || left.next < 0) continue;  // merged away, or nothing to its right any more
    const Symbol& right = symbols[left.next];
    if (merges.find(left.id, right.id).merged != top.merged) continue;  // stale candidate
    const int32_t removed = left.next;
    left.id = top.merged;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    symbols[removed].id = -1;
    push_pair(left.prev);
    push_pair(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
}

// --- encode / decode --------------------------------------------------------------------------

void Tokenizer::Impl::encode_segment(std::string_view segment, PreTokenizer::Scratch& scratch,
                                     std::vector<std::string_view>& pieces, std::vector<TokenId>& ids) const {
  // Pass 2: tokens with "normalized": true, matched inside the gaps of pass 1. There is no
  // normalizer, so the gap text is what they are matched against.
  size_t gap_start = 0;
  auto flush_gap = [&](size_t end) {
    if (end <= gap_start) return;
    pieces.clear();
    pre_tokenizer->split(segment.substr(gap_start, end - gap_start), scratch, pieces);
    for (std::string_view piece : pieces) bpe(piece, ids);
  };
  if (!normalized_added_tokens.empty()) {
    for (size_t pos = 0; pos < segment.size();) {
      if (normalized_added_tokens.may_start(static_cast<unsigned char>(segment[pos]))) {
        const auto [id, length] = normalized_added_tokens.longest_match(segment, pos);
        if (id >= 0) {
          flush_gap(pos);
          ids.push_back(id);
          pos += length;
          gap_start = pos;
          continue;
        }
      }
      ++pos;
    }
  }
  flush_gap(segment.size());
}

void Tokenizer::encode_into(std::string_view text, std::vector<TokenId>& ids) const {
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::repair(text);
    text = repaired;
  }
  const Impl& impl = *impl_;
  // Matching state does not depend on the patterns, so one per thread serves every tokenizer;
  // creating it (a JIT stack) per call would cost more than encoding a short message.
  thread_local const PreTokenizer::ScratchPtr scratch = impl.pre_tokenizer->make_scratch();
  thread_local std::vector<std::string_view> pieces;
  // Pass 1: tokens with "normalized": false, matched on the raw text.
  size_t gap_start = 0;
  for (size_t pos = 0; pos < text.size();) {
    if (impl.raw_added_tokens.may_start(static_cast<unsigned char>(text[pos]))) {
      const auto [id, length] = impl.raw_added_tokens.longest_match(text, pos);
      if (id >= 0) {
        impl.encode_segment(text.substr(gap_start, pos - gap_start), *scratch, pieces, ids);
        ids.push_back(id);
        pos += length;
        gap_start = pos;
        continue;
      }
    }
    ++pos;
  }
  impl.encode_segment(text.substr(gap_start), *scratch, pieces, ids);
}

std::vector<TokenId> Tokenizer::encode(std::string_view text) const {
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 8);
  encode_into(text, ids);
  return ids;
}

bool Tokenizer::is_known(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_known.size() && impl_->id_known[id];
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
  if (!is_known(id)) fail("token id {} is not in the tokenizer's vocabulary (ids below {})", id, id_limit());
  return impl_->id_bytes[id];
}

std::string Tokenizer::decode(std::span<const TokenId> ids) const {
  std::string bytes;
  for (TokenId id : ids) bytes += token_bytes(id);
  return utf8::is_valid(bytes) ? bytes : utf8::repair(bytes);
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_token_ids.find(std::string(token)); it != impl_->added_token_ids.end()) return it->second;
  if (auto it = impl_->vocab.find(std::string(token)); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

TokenId Tokenizer::require_token(std::string_view token) const {
  const auto id = token_to_id(token);
  if (!id) fail("the tokenizer has no token '{}'", token);
  return *id;
}

size_t Tokenizer::id_limit() const { return impl_->id_known.size(); }

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

}  // namespace dsv4
