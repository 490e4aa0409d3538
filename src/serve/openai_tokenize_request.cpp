// POST /tokenize and POST /detokenize bodies (vLLM's shapes).
#include <fmt/core.h>

#include "serve/openai_request.h"
#include "serve/openai_request_internal.h"

namespace dsv4::openai {

using fields::json;
using fields::reject;

Parsed<TokenizeRequest> parse_tokenize_request(std::string_view body, const RequestLimits& limits) {
  Parsed<TokenizeRequest> result;
  try {
    const json request = fields::parse_body(body);
    TokenizeRequest tokenize;
    tokenize.model = fields::optional_string(request, "model", "model").value_or("");
    tokenize.return_token_strs = fields::optional_bool(request, "return_token_strs", "return_token_strs").value_or(false);
    if (fields::find(request, "messages") != nullptr) {
      Parsed<ChatRequest> chat = parse_chat_request(body, limits);
      if (!chat.ok()) {
        result.error = chat.error;
        return result;
      }
      tokenize.chat = std::move(chat.value);
    } else {
      const json* prompt = fields::find(request, "prompt");
      if (prompt == nullptr) reject("prompt", "'prompt' (text) or 'messages' is required.");
      tokenize.prompt = fields::read_string(*prompt, "prompt");
      tokenize.add_special_tokens = fields::optional_bool(request, "add_special_tokens", "add_special_tokens").value_or(true);
    }
    result.value = std::move(tokenize);
  } catch (const fields::FieldError& e) {
    result.error = e.error;
  } catch (const std::exception& e) {
    result.error = bad_request(fmt::format("Invalid request: {}", e.what()));
  }
  return result;
}

Parsed<DetokenizeRequest> parse_detokenize_request(std::string_view body, const RequestLimits& limits) {
  Parsed<DetokenizeRequest> result;
  try {
    const json request = fields::parse_body(body);
    DetokenizeRequest detokenize;
    detokenize.model = fields::optional_string(request, "model", "model").value_or("");
    const json* tokens = fields::find(request, "tokens");
    if (tokens == nullptr) reject("tokens", "'tokens' is required.");
    if (!tokens->is_array()) reject("tokens", "'tokens' must be a list of token ids.");
    for (size_t i = 0; i < tokens->size(); ++i)
      detokenize.tokens.push_back(detail::parse_token_id((*tokens)[i], fmt::format("tokens[{}]", i), limits));
    result.value = std::move(detokenize);
  } catch (const fields::FieldError& e) {
    result.error = e.error;
  } catch (const std::exception& e) {
    result.error = bad_request(fmt::format("Invalid request: {}", e.what()));
  }
  return result;
}

}  // namespace dsv4::openai
