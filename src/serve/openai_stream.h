// Server-sent events for streamed responses: each engine step's text delta becomes at most a few
// `data: {...}\n\n` chunks, written and flushed at once by the server.
//
// Chat (ChatStreamEncoder): the text goes through chat::OutputParser incrementally, so reasoning
// and content arrive as separate chunks ("reasoning_content" / "content" deltas) and a DSML
// tool-calls block never reaches content: held-back markup is released only as parsed
// "tool_calls" deltas (one per complete call, with its id, name and whole arguments). The role is
// sent in the first chunk that carries something — never an empty chunk before it. finish() sends
// the chunk with finish_reason ("tool_calls" when calls were made and generation ended on a stop),
// then with include_usage a chunk with "choices": [] and "usage", then `data: [DONE]`.
// With include_usage every other chunk carries "usage": null, as OpenAI documents.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "serve/chat_output_parser.h"
#include "serve/openai_error.h"
#include "serve/openai_response.h"

namespace dsv4::openai {

inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

std::string sse_event(const json& value);  // "data: " + compact JSON + "\n\n"
// The last event of a stream that fails after it started: the error object, then [DONE].
std::string sse_error(const ApiError& error);
// With include_usage: {"id", "object", "created", "model", "choices": [], "usage"}.
std::string sse_usage_chunk(const ResponseMeta& meta, std::string_view object, const Usage& usage);

class ChatStreamEncoder {
 public:
  ChatStreamEncoder(ResponseMeta meta, chat::ThinkingMode mode, bool include_usage);

  // One step's detokenized text (and, when asked for, the logprobs of its tokens: they ride on
  // the next chunk sent). Returns the SSE bytes to send now; empty when everything is held back.
  std::string push(std::string_view text, std::vector<TokenLogprob> logprobs = {});
  // End of generation: what was held back, the finish_reason chunk, the usage chunk, [DONE].
  std::string finish(FinishReason reason, const Usage& usage);

  // Everything parsed so far (for logs and the non-streaming path's tests).
  const chat::OutputDelta& output() const { return output_; }
  const std::string& parse_error() const { return parser_.error(); }

 private:
  std::string emit(chat::OutputDelta delta);
  std::string chunk(json delta, json finish_reason);

  ResponseMeta meta_;
  chat::OutputParser parser_;
  bool include_usage_;
  bool role_sent_ = false;
  size_t tool_calls_sent_ = 0;
  std::vector<TokenLogprob> pending_logprobs_;
  bool logprobs_wanted_ = false;
  chat::OutputDelta output_;
};

// /v1/completions: one choice's stream. finish() sends only its finish_reason chunk; the server
// ends the response with sse_usage_chunk (include_usage) and kSseDone after the last choice.
class CompletionStreamEncoder {
 public:
  CompletionStreamEncoder(ResponseMeta meta, size_t index, bool include_usage);

  std::string push(std::string_view text, std::vector<TokenLogprob> logprobs = {});
  std::string finish(FinishReason reason);

 private:
  std::string chunk(std::string_view text, const std::vector<TokenLogprob>* logprobs, json finish_reason);

  ResponseMeta meta_;
  size_t index_;
  bool include_usage_;
  size_t text_offset_ = 0;  // bytes sent so far: the logprobs' text_offset base
};

}  // namespace dsv4::openai
