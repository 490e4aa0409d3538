#include "serve/openai_error.h"

#include <fmt/core.h>

namespace dsv4::openai {

int http_status(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::BadRequest: return 400;
    case ErrorKind::Unauthorized: return 401;
    case ErrorKind::NotFound: return 404;
    case ErrorKind::TooLarge: return 413;
    case ErrorKind::Unavailable: return 503;
    case ErrorKind::Internal: return 500;
  }
  return 500;
}

namespace {

std::string_view default_code(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::BadRequest: return "";
    case ErrorKind::Unauthorized: return "invalid_api_key";
    case ErrorKind::NotFound: return "not_found";
    case ErrorKind::TooLarge: return "request_too_large";
    case ErrorKind::Unavailable: return "service_unavailable";
    case ErrorKind::Internal: return "internal_error";
  }
  return "";
}

nlohmann::ordered_json string_or_null(std::string_view text) {
  return text.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(std::string(text));
}

}  // namespace

nlohmann::ordered_json error_json(const ApiError& error) {
  nlohmann::ordered_json body;
  body["message"] = error.message;
  body["type"] = error.kind == ErrorKind::Unavailable || error.kind == ErrorKind::Internal ? "server_error" : "invalid_request_error";
  body["param"] = string_or_null(error.param);
  body["code"] = string_or_null(error.code.empty() ? default_code(error.kind) : std::string_view(error.code));
  nlohmann::ordered_json wrapper;
  wrapper["error"] = std::move(body);
  return wrapper;
}

std::string error_body(const ApiError& error) { return dump_json(error_json(error)); }

ApiError bad_request(std::string message, std::string param) {
  return {ErrorKind::BadRequest, std::move(message), std::move(param), {}};
}

ApiError unauthorized() {
  return {ErrorKind::Unauthorized, "Incorrect or missing API key (send 'Authorization: Bearer KEY').", {}, {}};
}

ApiError model_not_found(std::string_view model) {
  return {ErrorKind::NotFound, fmt::format("The model '{}' does not exist.", model), "model", "model_not_found"};
}

ApiError route_not_found(std::string_view method, std::string_view path) {
  return {ErrorKind::NotFound, fmt::format("No route for {} {}.", method, path), {}, {}};
}

ApiError body_too_large(size_t limit_bytes) {
  return {ErrorKind::TooLarge, fmt::format("The request body is larger than the limit of {} bytes.", limit_bytes), {}, {}};
}

ApiError unavailable(std::string message) { return {ErrorKind::Unavailable, std::move(message), {}, {}}; }

ApiError internal_error(std::string message) { return {ErrorKind::Internal, std::move(message), {}, {}}; }

std::string dump_json(const nlohmann::ordered_json& value) {
  return value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace dsv4::openai
