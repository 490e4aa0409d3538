// Streaming detokenizer: turns generated ids into text as soon as the text is valid UTF-8,
// holding back the bytes of a character split across tokens (byte-level BPE splits rare characters
// and emoji into several tokens). The concatenation of everything push() and finish() return
// equals Tokenizer::decode of all the ids, byte for byte.
#pragma once
#include <string>

#include "serve/tokenizer.h"

namespace dsv4 {

class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}

  // Text that became complete with this token (often empty while a character is incomplete).
  // Throws dsv4::Error for an id outside the vocabulary.
  std::string push(TokenId id);
  // The held-back bytes, an unfinished character repaired to U+FFFD; resets the stream.
  std::string finish();
  // Bytes currently held back (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;
};

}  // namespace dsv4
