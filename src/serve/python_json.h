// JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes it (", " and ": "
// separators, keys in insertion order, non-ASCII characters unescaped). DeepSeek-V4's prompt format
// embeds tool schemas and tool-call arguments this way, so the bytes the model saw in training
// depend on it.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace dsv4 {

std::string python_json_dumps(const nlohmann::ordered_json& value);
std::string python_json_string(std::string_view text);  // one quoted, escaped string

}  // namespace dsv4
