// OpenAI-style API errors: what the server answers when a request cannot be served. Every
// failure a client can cause becomes one of these (never an exception escaping the handler), so
// the status, the message and the parameter it names are decided in one place.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace dsv4::openai {

enum class ErrorKind {
  BadRequest,    // 400: malformed body, wrong types, out-of-range values, prompt too long
  Unauthorized,  // 401: missing or wrong API key
  NotFound,      // 404: unknown model or route
  TooLarge,      // 413: body over the server's limit
  Unavailable,   // 503: still loading, or over capacity
  Internal,      // 500: the engine failed while serving the request (a bug, never the client's input)
};

struct ApiError {
  ErrorKind kind = ErrorKind::BadRequest;
  std::string message;
  std::string param;  // the offending request field ("messages[2].content"); empty → null
  std::string code;   // machine-readable code ("context_length_exceeded"); empty → the kind's default
};

int http_status(ErrorKind kind);

// {"error": {"message", "type", "param", "code"}}. type is "invalid_request_error" for client
// errors (as OpenAI answers 400, 401, 404 and 413 alike) and "server_error" for 500 and 503.
nlohmann::ordered_json error_json(const ApiError& error);
std::string error_body(const ApiError& error);  // error_json as text

// Shorthands for the errors the server raises outside request parsing.
ApiError bad_request(std::string message, std::string param = {});
ApiError unauthorized();
ApiError model_not_found(std::string_view model);
ApiError route_not_found(std::string_view method, std::string_view path);
ApiError body_too_large(size_t limit_bytes);
ApiError unavailable(std::string message);
ApiError internal_error(std::string message);

// Serialises model-produced text safely: invalid UTF-8 becomes U+FFFD instead of an exception.
std::string dump_json(const nlohmann::ordered_json& value);

}  // namespace dsv4::openai
