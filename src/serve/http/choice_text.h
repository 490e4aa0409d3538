// One choice's generated token ids → the text the client gets: the streaming detokenizer (a
// character split across tokens waits for its last byte), the stop-string matcher (a suffix that
// may start a stop string waits for the next token), and the rules for what is not output:
// the EOS / stop token that ended generation (vLLM leaves it out of the text, and counts it in
// usage), ids the tokenizer does not know (a model's vocabulary may be larger than its
// tokenizer's; they decode to nothing), and everything after a stop string.
// Pure: no engine, no socket; the server feeds it the engine's token events.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "serve/detokenizer.h"
#include "serve/stop_matcher.h"
#include "serve/tokenizer.h"

namespace dsv4::serve {

class ChoiceText {
 public:
  ChoiceText(const Tokenizer& tokenizer, std::vector<std::string> stop_strings);

  struct Delta {
    std::string text;      // to send now (may be empty while something is held back)
    bool stopped = false;  // a stop string completed with this token: send no more, stop the request
  };
  // A generated token; `is_stop_token`: the EOS / stop id that ends generation. Tokens pushed
  // after a stop string matched are ignored (they are not counted either).
  Delta push(int32_t token, bool is_stop_token);
  // Generation ended: what was held back (nothing after a stop string).
  std::string finish();

  bool stopped() const { return matcher_.stopped(); }
  // Tokens that count as generated: every token pushed up to and including the one that
  // completed a stop string.
  int64_t tokens() const { return tokens_; }
  // The whole text sent so far.
  const std::string& text() const { return text_; }

 private:
  std::string emit(Delta& delta, const std::string& piece);

  const Tokenizer& tokenizer_;
  StreamingDetokenizer detokenizer_;
  openai::StopStringMatcher matcher_;
  int64_t tokens_ = 0;
  std::string text_;
};

}  // namespace dsv4::serve
