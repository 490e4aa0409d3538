// The inverse of chat_format for model output: splits generated text into reasoning_content,
// content and OpenAI tool_calls (DSML), incrementally. Text is pushed as it is detokenized; each
// push returns only what is certain. A suffix that might be the start of a marker (</think>, the
// EOS text, a DSML tool-calls block) is held back until the next push settles it, so partial
// markup never reaches streamed content; an incomplete UTF-8 character is held back too.
// Feeding the whole text at once and feeding it in any split gives the same concatenated result.
//
// Output grammar (SPEC.md §6), lenient where the model may drift:
//   [reasoning </think>] content [\n\n<｜DSML｜tool_calls> invokes </｜DSML｜tool_calls>] <｜end▁of▁sentence｜>
// In thinking mode the output starts inside the reasoning (the prompt ended with <think>). The
// "\n\n" before the tool-calls block is optional. Text after the block is content again; text
// after the EOS text is ignored. A block left unterminated at finish() is reported in error().
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "serve/chat_format.h"

namespace dsv4::chat {

struct OutputDelta {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCall> tool_calls;  // complete calls; arguments are JSON object text
  bool empty() const { return reasoning_content.empty() && content.empty() && tool_calls.empty(); }
  void append(OutputDelta&& other);
};

class OutputParser {
 public:
  explicit OutputParser(ThinkingMode mode);

  OutputDelta push(std::string_view text);
  // End of generation: releases what was held back.
  OutputDelta finish();

  // The whole output at once (push + finish).
  static OutputDelta parse(std::string_view text, ThinkingMode mode);

  bool saw_eos() const { return state_ == State::Done; }
  // Non-empty when the output broke the grammar (an unterminated or malformed tool call).
  const std::string& error() const { return error_; }

 private:
  enum class State { Reasoning, Content, ToolCalls, Done };
  void step(OutputDelta& delta, bool final);
  void emit_text(OutputDelta& delta, std::string_view text) const;
  void parse_invoke(std::string_view invoke, OutputDelta& delta);

  State state_;
  std::string pending_;  // received but not yet emitted
  std::string error_;
};

}  // namespace dsv4::chat
