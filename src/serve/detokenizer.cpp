#include "serve/detokenizer.h"

#include "serve/utf8.h"

namespace dsv4 {

std::string StreamingDetokenizer::push(TokenId id) {
  pending_ += tokenizer_->token_bytes(id);
  // Only an unfinished (but so far valid) sequence at the very end can change meaning when more
  // bytes arrive; everything before it is repaired exactly as a whole-text decode would.
  const size_t hold = utf8::incomplete_tail_length(pending_);
  const std::string_view ready = std::string_view(pending_).substr(0, pending_.size() - hold);
  std::string out = utf8::is_valid(ready) ? std::string(ready) : utf8::repair(ready);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StreamingDetokenizer::finish() {
  std::string out = utf8::repair(pending_);
  pending_.clear();
  return out;
}

}  // namespace dsv4
