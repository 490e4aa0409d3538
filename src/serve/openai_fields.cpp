#include "serve/openai_fields.h"

#include <fmt/core.h>

#include <cmath>
#include <limits>

namespace dsv4::openai::fields {
namespace {

// nlohmann's parser keeps its own stack, but dumping and walking a value recurses; a body of a
// million '[' must not reach that code. Real requests (tool schemas included) stay far below.
constexpr int kMaxNesting = 128;

bool nesting_within_limit(std::string_view body) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxNesting) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

std::string_view type_name(const json& value) {
  if (value.is_boolean()) return "a boolean";
  if (value.is_number()) return "a number";
  if (value.is_string()) return "a string";
  if (value.is_array()) return "an array";
  if (value.is_object()) return "an object";
  return "null";
}

}  // namespace

void reject(std::string param, std::string message) {
  throw FieldError{bad_request(std::move(message), std::move(param))};
}

const json* find(const json& object, std::string_view key) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

bool read_bool(const json& value, const std::string& path) {
  if (!value.is_boolean()) reject(path, fmt::format("'{}' must be a boolean, got {}.", path, type_name(value)));
  return value.get<bool>();
}

double read_number(const json& value, const std::string& path) {
  if (!value.is_number()) reject(path, fmt::format("'{}' must be a number, got {}.", path, type_name(value)));
  return value.get<double>();
}

int64_t read_integer(const json& value, const std::string& path) {
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      reject(path, fmt::format("'{}' is too large: {}.", path, value.get<uint64_t>()));
    return static_cast<int64_t>(value.get<uint64_t>());
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  // Pydantic (and so vLLM) accepts 16.0 for an integer field; 16.5 is an error.
  if (value.is_number_float()) {
    const double number = value.get<double>();
    if (std::isfinite(number) && number == std::floor(number) && std::fabs(number) < 9.0e18)
      return static_cast<int64_t>(number);
  }
  reject(path, fmt::format("'{}' must be an integer, got {}.", path, value.is_number() ? value.dump() : std::string(type_name(value))));
}

std::string read_string(const json& value, const std::string& path) {
  if (!value.is_string()) reject(path, fmt::format("'{}' must be a string, got {}.", path, type_name(value)));
  return value.get<std::string>();
}

std::optional<bool> optional_bool(const json& object, std::string_view key, const std::string& path) {
  const json* value = find(object, key);
  if (value == nullptr) return std::nullopt;
  return read_bool(*value, path);
}

std::optional<int64_t> optional_integer(const json& object, std::string_view key, const std::string& path) {
  const json* value = find(object, key);
  if (value == nullptr) return std::nullopt;
  return read_integer(*value, path);
}

std::optional<std::string> optional_string(const json& object, std::string_view key, const std::string& path) {
  const json* value = find(object, key);
  if (value == nullptr) return std::nullopt;
  return read_string(*value, path);
}

double number_in_range(const json& value, const std::string& path, double low, double high, bool low_open) {
  const double number = read_number(value, path);
  const bool ok = std::isfinite(number) && (low_open ? number > low : number >= low) && number <= high;
  if (!ok) {
    const std::string range = high == std::numeric_limits<double>::max()
                                  ? fmt::format("{} {}", low_open ? "greater than" : "at least", low)
                                  : fmt::format("in {}{}, {}]", low_open ? "(" : "[", low, high);
    reject(path, fmt::format("'{}' must be {}, got {}.", path, range, number));
  }
  return number;
}

int64_t integer_in_range(const json& value, const std::string& path, int64_t low, int64_t high) {
  const int64_t number = read_integer(value, path);
  if (number < low || number > high) {
    const std::string range = high == std::numeric_limits<int64_t>::max() ? fmt::format("at least {}", low)
                                                                          : fmt::format("in [{}, {}]", low, high);
    reject(path, fmt::format("'{}' must be {}, got {}.", path, range, number));
  }
  return number;
}

json parse_body(std::string_view body) {
  if (!nesting_within_limit(body))
    reject("", fmt::format("The request body nests arrays or objects deeper than {} levels.", kMaxNesting));
  json parsed;
  try {
    parsed = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    // nlohmann's what() starts with "[json.exception.parse_error.101] "; the rest is the story.
    std::string what = e.what();
    if (const size_t end = what.find("] "); what.rfind("[json.exception", 0) == 0 && end != std::string::npos)
      what.erase(0, end + 2);
    reject("", fmt::format("The request body is not valid JSON: {}", what));
  }
  if (!parsed.is_object()) reject("", "The request body must be a JSON object.");
  return parsed;
}

}  // namespace dsv4::openai::fields
