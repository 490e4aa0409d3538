// OpenAI response objects, built from typed results: non-streaming chat and text completions,
// the usage object, logprobs in both endpoints' shapes, and GET /v1/models. Pure functions; the
// caller supplies ids and timestamps (so tests are deterministic). The streaming side is in
// openai_stream.h.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/chat_output_parser.h"

namespace dsv4::openai {

using json = nlohmann::ordered_json;

struct ResponseMeta {
  std::string id;       // "chatcmpl-…" / "cmpl-…" (response_id)
  int64_t created = 0;  // Unix seconds
  std::string model;    // the served model name
};

// prefix + 24 hex digits of `nonce` (the caller's random number).
std::string response_id(std::string_view prefix, uint64_t nonce);
// The id of a response's index-th tool call ("call_<response suffix>_<index>"): unique per
// response, deterministic for tests.
std::string tool_call_id(std::string_view response_id, size_t index);

enum class FinishReason { Stop, Length, ToolCalls };
std::string_view finish_reason_name(FinishReason reason);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};
json usage_json(const Usage& usage);

struct TopLogprob {
  std::string token;  // the token's text (its bytes; may be part of a UTF-8 character)
  double logprob = 0;
};
struct TokenLogprob {
  std::string token;
  double logprob = 0;
  std::vector<TopLogprob> top;
};

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}.
json chat_logprobs_json(const std::vector<TokenLogprob>& tokens);
// Completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"};
// offsets count bytes from first_offset.
json completion_logprobs_json(const std::vector<TokenLogprob>& tokens, size_t first_offset);

// A tool call as OpenAI's message / delta carries it.
json tool_call_json(const chat::ToolCall& call, std::string_view id);

struct ChatResult {
  chat::OutputDelta output;  // the whole parsed output (OutputParser::parse)
  FinishReason finish_reason = FinishReason::Stop;
  bool with_logprobs = false;
  std::vector<TokenLogprob> logprobs;
};

// {"id", "object": "chat.completion", "created", "model", "choices": [{"index": 0, "message":
// {"role", "content", "reasoning_content"?, "tool_calls"?}, "logprobs", "finish_reason"}], "usage"}.
// A generation that ended on EOS after tool calls finishes with "tool_calls"; content is null when
// the turn is only tool calls.
json chat_response_json(const ResponseMeta& meta, const ChatResult& result, const Usage& usage);

struct CompletionChoice {
  std::string text;
  FinishReason finish_reason = FinishReason::Stop;
  bool with_logprobs = false;
  std::vector<TokenLogprob> logprobs;
};

// {"id", "object": "text_completion", "created", "model", "choices": [{"index", "text",
// "logprobs", "finish_reason"}], "usage"}; choice i answers prompt i.
json completion_response_json(const ResponseMeta& meta, const std::vector<CompletionChoice>& choices, const Usage& usage);

struct ModelCard {
  std::string id;  // the served model name
  int64_t created = 0;
  std::string owned_by = "dsv4";
  std::string root;  // the checkpoint directory it was loaded from
  int64_t max_model_len = 0;
};

// {"object": "list", "data": [{"id", "object": "model", "created", "owned_by", "root", "parent",
// "max_model_len", "permission"}]}: the fields vLLM returns.
json models_json(const std::vector<ModelCard>& models);

}  // namespace dsv4::openai
