// Request bodies of POST /v1/chat/completions and POST /v1/completions, parsed and validated into
// typed structs. Pure functions: no tokenizer, no engine. Unknown fields are accepted and ignored
// (as vLLM does); a wrong type or an out-of-range value is a 400 naming the parameter. Nothing
// throws: every failure comes back as an ApiError.
//
// Assumptions (OpenAI / vLLM behaviour as documented publicly):
// - max_completion_tokens wins over max_tokens (vLLM: `max_completion_tokens or max_tokens`).
//   Chat without either generates up to the context limit; completions default to 16 (OpenAI).
// - temperature [0, 2], top_p (0, 1], top_k -1 or 0 (off) or > 0, min_p [0, 1], presence and
//   frequency penalties [-2, 2], repetition_penalty > 0, top_logprobs and completions logprobs
//   [0, 20] (vLLM's default max_logprobs).
// - Thinking comes from chat_template_kwargs: `thinking` or `enable_thinking` (bool; default off),
//   `drop_thinking` (bool), `reasoning_effort` ("high" / "max"; also accepted top-level).
// - tool_choice "auto" / "none" only ("none" leaves the tools out of the prompt); "required" and a
//   named function need constrained decoding, which the engine does not have: 400.
// - response_format "text", or "json_schema" which DeepSeek-V4's encoding states in the system
//   turn (a prompt instruction, not enforced); "json_object" (no schema) is a 400.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "serve/chat_format.h"
#include "serve/openai_error.h"

namespace dsv4::openai {

template <typename T>
struct Parsed {
  std::optional<T> value;
  std::optional<ApiError> error;
  bool ok() const { return value.has_value(); }
};

// What the server knows about the model when it validates a request.
struct RequestLimits {
  int64_t max_model_len = 0;  // context length (prompt + completion)
  int64_t vocab_size = 0;     // token ids (prompts, stop_token_ids) must be below; 0 = unchecked
};

// Sampling and stopping, shared by both endpoints.
struct GenerationParams {
  std::optional<int64_t> max_tokens;  // resolved from max_completion_tokens / max_tokens; set by fit_context
  int64_t min_tokens = 0;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = -1;  // -1 (or 0 as given) = off; normalised to -1
  double min_p = 0.0;
  std::optional<int64_t> seed;
  std::vector<std::string> stop;  // non-empty strings
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  double repetition_penalty = 1.0;
  bool logprobs = false;  // chat: logprobs; completions: logprobs given
  int top_logprobs = 0;   // chat: top_logprobs; completions: the logprobs integer
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

enum class ToolChoice { Auto, None };

struct ChatRequest {
  std::string model;  // empty when not given
  GenerationParams params;
  std::vector<chat::Message> messages;  // as chat_format takes them (tools on the system turn)
  nlohmann::ordered_json tools;         // the request's tool list, or null
  ToolChoice tool_choice = ToolChoice::Auto;
  chat::EncodeOptions encode;
  std::string prompt;  // encode_messages(messages, encode): the text to tokenize
};

struct CompletionPrompt {
  std::string text;              // when given as text
  std::vector<int32_t> token_ids;  // when given as token ids
  bool is_tokens = false;
};

struct CompletionRequest {
  std::string model;
  GenerationParams params;
  std::vector<CompletionPrompt> prompts;  // one choice per prompt (index = position)
  bool echo = false;
};

Parsed<ChatRequest> parse_chat_request(std::string_view body, const RequestLimits& limits);
Parsed<CompletionRequest> parse_completion_request(std::string_view body, const RequestLimits& limits);

// POST /tokenize (vLLM's extension): either a chat body ("messages", encoded as for
// /v1/chat/completions) or {"prompt": text, "add_special_tokens": true (BOS first)}; with
// "return_token_strs" the answer also lists each token's text.
struct TokenizeRequest {
  std::string model;
  std::optional<ChatRequest> chat;  // given "messages": its encoded prompt is tokenized
  std::string prompt;
  bool add_special_tokens = true;
  bool return_token_strs = false;
};
// POST /detokenize: {"tokens": [id, ...]}.
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
Parsed<TokenizeRequest> parse_tokenize_request(std::string_view body, const RequestLimits& limits);
Parsed<DetokenizeRequest> parse_detokenize_request(std::string_view body, const RequestLimits& limits);

// After tokenization: checks prompt + max_tokens against max_model_len (vLLM's messages) and
// fills max_tokens when the request left it open (the rest of the context). prompt_param names
// the field the prompt came from ("messages" or "prompt").
std::optional<ApiError> fit_context(GenerationParams& params, int64_t prompt_tokens, int64_t max_model_len,
                                    std::string_view prompt_param);

}  // namespace dsv4::openai
