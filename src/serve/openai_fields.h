// Typed readers for request fields (internal to the openai_*request.cpp files). A failed read
// throws FieldError carrying the ApiError to answer; the public parse functions catch it, so it
// never leaves them. A field given as null counts as absent, as OpenAI's and vLLM's schemas do.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "serve/openai_error.h"

namespace dsv4::openai::fields {

using json = nlohmann::ordered_json;

struct FieldError {
  ApiError error;
};

[[noreturn]] void reject(std::string param, std::string message);

// The value of `key`, or nullptr when it is absent or null.
const json* find(const json& object, std::string_view key);

// `path` is the parameter's name in messages ("stream_options.include_usage").
bool read_bool(const json& value, const std::string& path);
double read_number(const json& value, const std::string& path);
int64_t read_integer(const json& value, const std::string& path);
std::string read_string(const json& value, const std::string& path);

std::optional<bool> optional_bool(const json& object, std::string_view key, const std::string& path);
std::optional<int64_t> optional_integer(const json& object, std::string_view key, const std::string& path);
std::optional<std::string> optional_string(const json& object, std::string_view key, const std::string& path);

// A number in [low, high] (open at low when low_open), else a 400 naming path.
double number_in_range(const json& value, const std::string& path, double low, double high, bool low_open = false);
int64_t integer_in_range(const json& value, const std::string& path, int64_t low, int64_t high);

// Parses a request body: not JSON, truncated, invalid UTF-8, nested too deeply or not an object
// are 400s.
json parse_body(std::string_view body);

}  // namespace dsv4::openai::fields
