#include "serve/http/choice_text.h"

namespace dsv4::serve {

ChoiceText::ChoiceText(const Tokenizer& tokenizer, std::vector<std::string> stop_strings)
    : tokenizer_(tokenizer), detokenizer_(tokenizer), matcher_(std::move(stop_strings)) {}

std::string ChoiceText::emit(Delta& delta, const std::string& piece) {
  if (matcher_.stopped()) return {};
  openai::StopStringMatcher::Result result = matcher_.push(piece);
  delta.stopped = result.stopped;
  text_ += result.text;
  return result.text;
}

ChoiceText::Delta ChoiceText::push(int32_t token, bool is_stop_token) {
  Delta delta;
  if (matcher_.stopped()) return delta;
  ++tokens_;
  if (is_stop_token || !tokenizer_.is_known(token)) return delta;
  delta.text = emit(delta, detokenizer_.push(token));
  return delta;
}

std::string ChoiceText::finish() {
  Delta delta;
  std::string out = emit(delta, detokenizer_.finish());
  if (!matcher_.stopped()) {
    std::string held = matcher_.finish();
    text_ += held;
    out += held;
  }
  return out;
}

}  // namespace dsv4::serve
