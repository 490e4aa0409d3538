#include "serve/python_json.h"

#include <fmt/format.h>

#include <cmath>

namespace dsv4 {
namespace {

void append_string(std::string& out, std::string_view text) {
  out += '"';
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
        else out += c;
    }
  }
  out += '"';
}

// Python's repr of a float: the shortest digits that round-trip, written in fixed notation when
// the decimal exponent is in [-4, 16) (with ".0" for integral values), otherwise as 1.5e-07.
std::string python_float(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  const std::string sign = std::signbit(value) ? "-" : "";
  if (value == 0) return sign + "0.0";
  // fmt's "{}" gives the shortest round-trip digits, in whichever notation it prefers.
  const std::string shortest = fmt::format("{}", std::fabs(value));
  const size_t e = shortest.find('e');
  const std::string mantissa = shortest.substr(0, e);
  const int exponent_part = e == std::string::npos ? 0 : std::stoi(shortest.substr(e + 1));
  const size_t point = mantissa.find('.');
  const int integer_digits = static_cast<int>(point == std::string::npos ? mantissa.size() : point);
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  const size_t leading_zeros = digits.find_first_not_of('0');
  digits.erase(0, leading_zeros);
  const int exponent = integer_digits - 1 + exponent_part - static_cast<int>(leading_zeros);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (exponent >= 16 || exponent < -4) {
    std::string text = digits.substr(0, 1);
    if (digits.size() > 1) text += "." + digits.substr(1);
    return sign + text + fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  }
  if (exponent < 0) return sign + "0." + std::string(-exponent - 1, '0') + digits;
  if (static_cast<int>(digits.size()) <= exponent + 1) return sign + digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
  return sign + digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
}

void append_value(std::string& out, const nlohmann::ordered_json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) out += ", ";
        first = false;
        append_string(out, key);
        out += ": ";
        append_value(out, item);
      }
      out += '}';
      break;
    }
    case nlohmann::json::value_t::array: {
      out += '[';
      for (size_t i = 0; i < value.size(); ++i) {
        if (i) out += ", ";
        append_value(out, value[i]);
      }
      out += ']';
      break;
    }
    case nlohmann::json::value_t::string: append_string(out, value.get_ref<const std::string&>()); break;
    case nlohmann::json::value_t::boolean: out += value.get<bool>() ? "true" : "false"; break;
    case nlohmann::json::value_t::null: out += "null"; break;
    case nlohmann::json::value_t::number_float: out += python_float(value.get<double>()); break;
    default: out += value.dump(); break;  // integers
  }
}

}  // namespace

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  append_value(out, value);
  return out;
}

std::string python_json_string(std::string_view text) {
  std::string out;
  append_string(out, text);
  return out;
}

}  // namespace dsv4
