// Shared generation parameters, /v1/completions bodies, and the context-length check.
#include "serve/openai_request.h"

#include <fmt/core.h>

#include <limits>

#include "serve/openai_request_internal.h"

namespace dsv4::openai {
namespace detail {

using fields::json;
using fields::reject;

namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();
constexpr double kMaxDouble = std::numeric_limits<double>::max();
constexpr int64_t kMaxLogprobs = 20;  // vLLM's default --max-logprobs

std::vector<std::string> parse_stop(const json& body) {
  const json* stop = fields::find(body, "stop");
  std::vector<std::string> stops;
  if (stop == nullptr) return stops;
  if (stop->is_string()) {
    stops.push_back(stop->get<std::string>());
  } else if (stop->is_array()) {
    for (size_t i = 0; i < stop->size(); ++i) stops.push_back(fields::read_string((*stop)[i], fmt::format("stop[{}]", i)));
  } else {
    reject("stop", "'stop' must be a string or a list of strings.");
  }
  // An empty stop string would end every generation before its first token.
  std::erase_if(stops, [](const std::string& s) { return s.empty(); });
  return stops;
}

void parse_max_tokens(const json& body, Endpoint endpoint, GenerationParams& params) {
  std::optional<int64_t> max_tokens;
  if (const json* value = fields::find(body, "max_tokens")) max_tokens = fields::integer_in_range(*value, "max_tokens", 1, kMaxInt);
  if (endpoint == Endpoint::Chat) {
    if (const json* value = fields::find(body, "max_completion_tokens"))
      max_tokens = fields::integer_in_range(*value, "max_completion_tokens", 1, kMaxInt);
  } else if (!max_tokens) {
    max_tokens = 16;  // OpenAI's (and vLLM's) default for /v1/completions
  }
  params.max_tokens = max_tokens;
  if (const json* value = fields::find(body, "min_tokens")) params.min_tokens = fields::integer_in_range(*value, "min_tokens", 0, kMaxInt);
  if (params.max_tokens && params.min_tokens > *params.max_tokens)
    reject("min_tokens", fmt::format("'min_tokens' ({}) must be less than or equal to 'max_tokens' ({}).", params.min_tokens,
                                     *params.max_tokens));
}

void parse_sampling(const json& body, GenerationParams& params) {
  if (const json* v = fields::find(body, "temperature")) params.temperature = fields::number_in_range(*v, "temperature", 0, 2);
  if (const json* v = fields::find(body, "top_p")) params.top_p = fields::number_in_range(*v, "top_p", 0, 1, true);
  if (const json* v = fields::find(body, "top_k")) {
    params.top_k = fields::integer_in_range(*v, "top_k", -1, kMaxInt);
    if (params.top_k == 0) params.top_k = -1;
  }
  if (const json* v = fields::find(body, "min_p")) params.min_p = fields::number_in_range(*v, "min_p", 0, 1);
  params.seed = fields::optional_integer(body, "seed", "seed");
  if (const json* v = fields::find(body, "presence_penalty")) params.presence_penalty = fields::number_in_range(*v, "presence_penalty", -2, 2);
  if (const json* v = fields::find(body, "frequency_penalty"))
    params.frequency_penalty = fields::number_in_range(*v, "frequency_penalty", -2, 2);
  if (const json* v = fields::find(body, "repetition_penalty"))
    params.repetition_penalty = fields::number_in_range(*v, "repetition_penalty", 0, kMaxDouble, true);
}

void parse_choice_count(const json& body) {
  if (const json* n = fields::find(body, "n")) {
    const int64_t count = fields::integer_in_range(*n, "n", 1, kMaxInt);
    if (count != 1) reject("n", fmt::format("'n' = {} is not supported: this server returns one choice per request (n = 1).", count));
  }
  if (const json* best_of = fields::find(body, "best_of")) {
    const int64_t count = fields::integer_in_range(*best_of, "best_of", 1, kMaxInt);
    if (count != 1) reject("best_of", fmt::format("'best_of' = {} is not supported (only 1).", count));
  }
}

void parse_logprobs(const json& body, Endpoint endpoint, GenerationParams& params) {
  if (endpoint == Endpoint::Chat) {
    params.logprobs = fields::optional_bool(body, "logprobs", "logprobs").value_or(false);
    if (const json* v = fields::find(body, "top_logprobs")) {
      params.top_logprobs = static_cast<int>(fields::integer_in_range(*v, "top_logprobs", 0, kMaxLogprobs));
      if (params.top_logprobs > 0 && !params.logprobs)
        reject("top_logprobs", "'top_logprobs' needs 'logprobs' set to true.");
    }
  } else if (const json* v = fields::find(body, "logprobs")) {
    params.logprobs = true;
    params.top_logprobs = static_cast<int>(fields::integer_in_range(*v, "logprobs", 0, kMaxLogprobs));
  }
}

void parse_streaming(const json& body, GenerationParams& params) {
  params.stream = fields::optional_bool(body, "stream", "stream").value_or(false);
  const json* options = fields::find(body, "stream_options");
  if (options == nullptr) return;
  if (!options->is_object()) reject("stream_options", "'stream_options' must be an object.");
  if (!params.stream) reject("stream_options", "'stream_options' can only be given when 'stream' is true.");
  params.include_usage = fields::optional_bool(*options, "include_usage", "stream_options.include_usage").value_or(false);
}

}  // namespace

int32_t parse_token_id(const json& value, const std::string& path, const RequestLimits& limits) {
  const int64_t high = limits.vocab_size > 0 ? limits.vocab_size - 1 : std::numeric_limits<int32_t>::max();
  const int64_t id = fields::read_integer(value, path);
  if (id < 0 || id > high)
    reject(path, fmt::format("Token id {} in '{}' is out of vocabulary (0 to {}).", id, path, high));
  return static_cast<int32_t>(id);
}

GenerationParams parse_generation_params(const json& body, Endpoint endpoint, const RequestLimits& limits) {
  GenerationParams params;
  parse_choice_count(body);
  parse_max_tokens(body, endpoint, params);
  parse_sampling(body, params);
  params.stop = parse_stop(body);
  if (const json* ids = fields::find(body, "stop_token_ids")) {
    if (!ids->is_array()) reject("stop_token_ids", "'stop_token_ids' must be a list of token ids.");
    for (size_t i = 0; i < ids->size(); ++i)
      params.stop_token_ids.push_back(parse_token_id((*ids)[i], fmt::format("stop_token_ids[{}]", i), limits));
  }
  params.ignore_eos = fields::optional_bool(body, "ignore_eos", "ignore_eos").value_or(false);
  parse_logprobs(body, endpoint, params);
  parse_streaming(body, params);
  return params;
}

}  // namespace detail

namespace {

using fields::json;
using fields::reject;

std::vector<int32_t> parse_token_list(const json& list, const std::string& path, const RequestLimits& limits) {
  if (list.empty()) reject(path, fmt::format("'{}' must not be empty.", path));
  std::vector<int32_t> ids;
  ids.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) ids.push_back(detail::parse_token_id(list[i], fmt::format("{}[{}]", path, i), limits));
  return ids;
}

CompletionPrompt text_prompt(const json& value, const std::string& path) {
  CompletionPrompt prompt;
  prompt.text = fields::read_string(value, path);
  if (prompt.text.empty()) reject(path, fmt::format("'{}' must not be empty.", path));
  return prompt;
}

// prompt: "text" | ["text", ...] | [id, ...] | [[id, ...], ...]
std::vector<CompletionPrompt> parse_prompts(const json& body, const RequestLimits& limits) {
  const json* prompt = fields::find(body, "prompt");
  if (prompt == nullptr) reject("prompt", "'prompt' is required.");
  if (prompt->is_string()) return {text_prompt(*prompt, "prompt")};
  if (!prompt->is_array()) reject("prompt", "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists.");
  if (prompt->empty()) reject("prompt", "'prompt' must not be empty.");
  std::vector<CompletionPrompt> prompts;
  const json& first = prompt->front();
  if (first.is_number()) {
    CompletionPrompt tokens;
    tokens.is_tokens = true;
    tokens.token_ids = parse_token_list(*prompt, "prompt", limits);
    prompts.push_back(std::move(tokens));
    return prompts;
  }
  for (size_t i = 0; i < prompt->size(); ++i) {
    const json& item = (*prompt)[i];
    const std::string path = fmt::format("prompt[{}]", i);
    if (first.is_string()) {
      prompts.push_back(text_prompt(item, path));
    } else if (first.is_array() && item.is_array()) {
      CompletionPrompt tokens;
      tokens.is_tokens = true;
      tokens.token_ids = parse_token_list(item, path, limits);
      prompts.push_back(std::move(tokens));
    } else {
      reject(path, "'prompt' must be a list of strings or a list of token-id lists, not a mixture.");
    }
  }
  return prompts;
}

}  // namespace

Parsed<CompletionRequest> parse_completion_request(std::string_view body, const RequestLimits& limits) {
  Parsed<CompletionRequest> result;
  try {
    const json request = fields::parse_body(body);
    CompletionRequest completion;
    completion.model = fields::optional_string(request, "model", "model").value_or("");
    completion.params = detail::parse_generation_params(request, detail::Endpoint::Completions, limits);
    completion.prompts = parse_prompts(request, limits);
    completion.echo = fields::optional_bool(request, "echo", "echo").value_or(false);
    if (const auto suffix = fields::optional_string(request, "suffix", "suffix"); suffix && !suffix->empty())
      reject("suffix", "'suffix' is not supported.");
    result.value = std::move(completion);
  } catch (const fields::FieldError& e) {
    result.error = e.error;
  } catch (const std::exception& e) {  // a bug of ours must still be a 400, not a crash
    result.error = bad_request(fmt::format("Invalid request: {}", e.what()));
  }
  return result;
}

std::optional<ApiError> fit_context(GenerationParams& params, int64_t prompt_tokens, int64_t max_model_len,
                                    std::string_view prompt_param) {
  // The messages are vLLM's (serving_engine.py), so clients that parse them keep working.
  if (prompt_tokens >= max_model_len) {
    ApiError error = bad_request(fmt::format("This model's maximum context length is {} tokens. However, your request has {} input "
                                             "tokens. Please reduce the length of the input messages.",
                                             max_model_len, prompt_tokens),
                                 std::string(prompt_param));
    error.code = "context_length_exceeded";
    return error;
  }
  const int64_t room = max_model_len - prompt_tokens;
  if (!params.max_tokens) {
    params.max_tokens = room;
  } else if (*params.max_tokens > room) {
    ApiError error = bad_request(fmt::format("'max_tokens' or 'max_completion_tokens' is too large: {}. This model's maximum context "
                                             "length is {} tokens and your request has {} input tokens ({} > {} - {}).",
                                             *params.max_tokens, max_model_len, prompt_tokens, *params.max_tokens, max_model_len,
                                             prompt_tokens),
                                 "max_tokens");
    error.code = "context_length_exceeded";
    return error;
  }
  if (params.min_tokens > *params.max_tokens)
    return bad_request(fmt::format("'min_tokens' ({}) must be less than or equal to 'max_tokens' ({}).", params.min_tokens,
                                   *params.max_tokens),
                       "min_tokens");
  return std::nullopt;
}

}  // namespace dsv4::openai
