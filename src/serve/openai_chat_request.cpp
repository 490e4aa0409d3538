// /v1/chat/completions bodies: messages, tools, thinking options; the prompt text at the end.
#include <fmt/core.h>

#include <algorithm>

#include "serve/openai_request.h"
#include "serve/openai_request_internal.h"

namespace dsv4::openai {
namespace {

using fields::json;
using fields::reject;

// content: a string, or a list of {"type": "text", "text": ...} parts (other part types name
// inputs this text-only model cannot take).
std::string parse_content(const json& content, const std::string& path) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) reject(path, fmt::format("'{}' must be a string or a list of content parts.", path));
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string part_path = fmt::format("{}[{}]", path, i);
    if (!part.is_object()) reject(part_path, fmt::format("'{}' must be an object.", part_path));
    const std::string type = fields::optional_string(part, "type", part_path + ".type").value_or("");
    if (type != "text")
      reject(part_path + ".type", fmt::format("Content part type '{}' in '{}' is not supported (text only).", type, part_path));
    const json* part_text = fields::find(part, "text");
    if (part_text == nullptr) reject(part_path + ".text", fmt::format("'{}.text' is required.", part_path));
    text += fields::read_string(*part_text, part_path + ".text");
  }
  return text;
}

// Arguments are JSON object text in OpenAI's schema; chat_format re-renders them as DSML
// parameters, so text that is not an object would fail later, inside the prompt encoding.
std::string parse_arguments(const json& function, const std::string& path) {
  const json* arguments = fields::find(function, "arguments");
  if (arguments == nullptr) return "{}";
  if (arguments->is_object()) return arguments->dump();
  const std::string text = fields::read_string(*arguments, path);
  const json parsed = json::parse(text, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object())
    reject(path, fmt::format("'{}' must be a JSON object (as text).", path));
  return text;
}

std::vector<chat::ToolCall> parse_tool_calls(const json& calls, const std::string& path) {
  if (!calls.is_array()) reject(path, fmt::format("'{}' must be a list.", path));
  std::vector<chat::ToolCall> parsed;
  for (size_t i = 0; i < calls.size(); ++i) {
    const json& call = calls[i];
    const std::string call_path = fmt::format("{}[{}]", path, i);
    if (!call.is_object()) reject(call_path, fmt::format("'{}' must be an object.", call_path));
    const std::string type = fields::optional_string(call, "type", call_path + ".type").value_or("function");
    if (type != "function") reject(call_path + ".type", fmt::format("Tool call type '{}' is not supported (function).", type));
    const json* function = fields::find(call, "function");
    if (function == nullptr || !function->is_object())
      reject(call_path + ".function", fmt::format("'{}.function' must be an object.", call_path));
    chat::ToolCall tool_call;
    tool_call.id = fields::optional_string(call, "id", call_path + ".id").value_or("");
    tool_call.name = fields::optional_string(*function, "name", call_path + ".function.name").value_or("");
    if (tool_call.name.empty()) reject(call_path + ".function.name", fmt::format("'{}.function.name' is required.", call_path));
    tool_call.arguments = parse_arguments(*function, call_path + ".function.arguments");
    parsed.push_back(std::move(tool_call));
  }
  return parsed;
}

chat::Message parse_message(const json& item, size_t index) {
  const std::string path = fmt::format("messages[{}]", index);
  if (!item.is_object()) reject(path, fmt::format("'{}' must be an object.", path));
  chat::Message message;
  const json* role = fields::find(item, "role");
  if (role == nullptr) reject(path + ".role", fmt::format("'{}.role' is required.", path));
  message.role = fields::read_string(*role, path + ".role");
  static const char* const kRoles[] = {"system", "developer", "user", "assistant", "tool"};
  if (std::find(std::begin(kRoles), std::end(kRoles), message.role) == std::end(kRoles))
    reject(path + ".role", fmt::format("'{}.role' '{}' is not one of system, developer, user, assistant, tool.", path, message.role));
  const bool assistant = message.role == "assistant";
  if (const json* content = fields::find(item, "content")) message.content = parse_content(*content, path + ".content");
  else if (!assistant) reject(path + ".content", fmt::format("'{}.content' is required for role '{}'.", path, message.role));
  if (assistant) {
    message.reasoning_content = fields::optional_string(item, "reasoning_content", path + ".reasoning_content").value_or("");
    if (const json* calls = fields::find(item, "tool_calls")) message.tool_calls = parse_tool_calls(*calls, path + ".tool_calls");
  }
  if (message.role == "tool") {
    const json* id = fields::find(item, "tool_call_id");
    if (id == nullptr) reject(path + ".tool_call_id", fmt::format("'{}.tool_call_id' is required for role 'tool'.", path));
    message.tool_call_id = fields::read_string(*id, path + ".tool_call_id");
  }
  return message;
}

json parse_tools(const json& request) {
  const json* tools = fields::find(request, "tools");
  if (tools == nullptr) return json();
  if (!tools->is_array()) reject("tools", "'tools' must be a list.");
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& tool = (*tools)[i];
    const std::string path = fmt::format("tools[{}]", i);
    if (!tool.is_object()) reject(path, fmt::format("'{}' must be an object.", path));
    const std::string type = fields::optional_string(tool, "type", path + ".type").value_or("");
    if (type != "function") reject(path + ".type", fmt::format("'{}.type' must be 'function'.", path));
    const json* function = fields::find(tool, "function");
    if (function == nullptr || !function->is_object()) reject(path + ".function", fmt::format("'{}.function' must be an object.", path));
    if (fields::optional_string(*function, "name", path + ".function.name").value_or("").empty())
      reject(path + ".function.name", fmt::format("'{}.function.name' is required.", path));
    fields::optional_string(*function, "description", path + ".function.description");
    if (const json* parameters = fields::find(*function, "parameters"); parameters && !parameters->is_object())
      reject(path + ".function.parameters", fmt::format("'{}.function.parameters' must be a JSON schema object.", path));
  }
  return tools->empty() ? json() : *tools;
}

ToolChoice parse_tool_choice(const json& request) {
  const json* choice = fields::find(request, "tool_choice");
  if (choice == nullptr) return ToolChoice::Auto;
  if (choice->is_string()) {
    const std::string value = choice->get<std::string>();
    if (value == "auto") return ToolChoice::Auto;
    if (value == "none") return ToolChoice::None;
    if (value == "required")
      reject("tool_choice", "'tool_choice' = 'required' is not supported (it needs constrained decoding); use 'auto'.");
    reject("tool_choice", fmt::format("'tool_choice' '{}' is not one of 'auto', 'none'.", value));
  }
  if (choice->is_object())
    reject("tool_choice", "A named 'tool_choice' is not supported (it needs constrained decoding); use 'auto'.");
  reject("tool_choice", "'tool_choice' must be a string.");
}

std::string parse_reasoning_effort(const json& value, const std::string& path) {
  const std::string effort = fields::read_string(value, path);
  if (effort != "high" && effort != "max")
    reject(path, fmt::format("'{}' '{}' is not supported by DeepSeek-V4 ('high' or 'max').", path, effort));
  return effort;
}

chat::EncodeOptions parse_encode_options(const json& request) {
  chat::EncodeOptions options;
  if (const json* effort = fields::find(request, "reasoning_effort"))
    options.reasoning_effort = parse_reasoning_effort(*effort, "reasoning_effort");
  const json* kwargs = fields::find(request, "chat_template_kwargs");
  if (kwargs == nullptr) return options;
  if (!kwargs->is_object()) reject("chat_template_kwargs", "'chat_template_kwargs' must be an object.");
  // "thinking" is DeepSeek's template variable; "enable_thinking" is what Qwen-style clients send.
  for (const char* key : {"thinking", "enable_thinking"})
    if (const auto on = fields::optional_bool(*kwargs, key, fmt::format("chat_template_kwargs.{}", key)))
      options.thinking_mode = *on ? chat::ThinkingMode::Thinking : chat::ThinkingMode::Chat;
  if (const auto drop = fields::optional_bool(*kwargs, "drop_thinking", "chat_template_kwargs.drop_thinking"))
    options.drop_thinking = *drop;
  if (const json* effort = fields::find(*kwargs, "reasoning_effort"))
    options.reasoning_effort = parse_reasoning_effort(*effort, "chat_template_kwargs.reasoning_effort");
  return options;
}

json parse_response_format(const json& request) {
  const json* format = fields::find(request, "response_format");
  if (format == nullptr) return json();
  if (!format->is_object()) reject("response_format", "'response_format' must be an object.");
  const std::string type = fields::optional_string(*format, "type", "response_format.type").value_or("");
  if (type == "text") return json();
  if (type == "json_object")
    reject("response_format", "'response_format' type 'json_object' is not supported (no constrained decoding); give a 'json_schema'.");
  if (type != "json_schema") reject("response_format.type", fmt::format("'response_format.type' '{}' is not supported.", type));
  const json* schema = fields::find(*format, "json_schema");
  if (schema == nullptr || !schema->is_object())
    reject("response_format.json_schema", "'response_format.json_schema' must be an object.");
  return *schema;
}

// DeepSeek's format carries tools and the response format on the first system turn.
void attach_to_system(std::vector<chat::Message>& messages, const json& tools, const json& response_format) {
  if (tools.is_null() && response_format.is_null()) return;
  auto system = std::find_if(messages.begin(), messages.end(), [](const chat::Message& m) { return m.role == "system"; });
  if (system == messages.end()) {
    chat::Message empty_system;
    empty_system.role = "system";
    system = messages.insert(messages.begin(), std::move(empty_system));
  }
  system->tools = tools;
  system->response_format = response_format;
}

ChatRequest parse_chat(const json& request, const RequestLimits& limits) {
  ChatRequest chat_request;
  chat_request.model = fields::optional_string(request, "model", "model").value_or("");
  chat_request.params = detail::parse_generation_params(request, detail::Endpoint::Chat, limits);
  const json* messages = fields::find(request, "messages");
  if (messages == nullptr) reject("messages", "'messages' is required.");
  if (!messages->is_array()) reject("messages", "'messages' must be a list.");
  if (messages->empty()) reject("messages", "'messages' must not be empty.");
  for (size_t i = 0; i < messages->size(); ++i) chat_request.messages.push_back(parse_message((*messages)[i], i));
  chat_request.tools = parse_tools(request);
  chat_request.tool_choice = parse_tool_choice(request);
  fields::optional_bool(request, "parallel_tool_calls", "parallel_tool_calls");
  chat_request.encode = parse_encode_options(request);
  const json prompt_tools = chat_request.tool_choice == ToolChoice::None ? json() : chat_request.tools;
  attach_to_system(chat_request.messages, prompt_tools, parse_response_format(request));
  try {
    chat_request.prompt = chat::encode_messages(chat_request.messages, chat_request.encode);
  } catch (const std::exception& e) {
    reject("messages", fmt::format("The messages cannot be encoded: {}", e.what()));
  }
  return chat_request;
}

}  // namespace

Parsed<ChatRequest> parse_chat_request(std::string_view body, const RequestLimits& limits) {
  Parsed<ChatRequest> result;
  try {
    result.value = parse_chat(fields::parse_body(body), limits);
  } catch (const fields::FieldError& e) {
    result.error = e.error;
  } catch (const std::exception& e) {  // a bug of ours must still be a 400, not a crash
    result.error = bad_request(fmt::format("Invalid request: {}", e.what()));
  }
  return result;
}

}  // namespace dsv4::openai
