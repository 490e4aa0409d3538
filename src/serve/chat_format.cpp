#include "serve/chat_format.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "core/error.h"
#include "serve/python_json.h"

namespace dsv4::chat {
namespace {

using nlohmann::ordered_json;

// The prompt texts below are part of the format the model was trained on; they must stay
// byte-identical to DeepSeek's (encoding_dsv4.py).
constexpr std::string_view kReasoningEffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, "
    "rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

constexpr std::string_view kResponseFormatIntro =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

std::string tools_block(const ordered_json& tools) {
  std::string schemas;
  for (const ordered_json& tool : tools) {
    if (!tool.is_object() || !tool.contains("function")) fail("each tool needs a 'function' object");
    if (!schemas.empty()) schemas += '\n';
    schemas += python_json_dumps(tool["function"]);
  }
  const std::string dsml(kDsml);
  return "## Tools\n\n"
         "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<" +
         dsml + "tool_calls>\" block like the following:\n\n<" + dsml + "tool_calls>\n<" + dsml +
         "invoke name=\"$TOOL_NAME\">\n<" + dsml +
         "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + dsml + "parameter>\n...\n</" +
         dsml + "invoke>\n<" + dsml + "invoke name=\"$TOOL_NAME2\">\n...\n</" + dsml + "invoke>\n</" + dsml +
         "tool_calls>\n\n"
         "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
         "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
         "If thinking_mode is enabled (triggered by " +
         std::string(kThinkStart) + "), you MUST output your complete reasoning inside " + std::string(kThinkStart) +
         "..." + std::string(kThinkEnd) +
         " BEFORE any tool calls or final response.\n\n"
         "Otherwise, output directly after " +
         std::string(kThinkEnd) +
         " with tool calls or final response.\n\n"
         "### Available Tool Schemas\n\n" +
         schemas +
         "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
}

// Arguments as DSML parameters: strings verbatim with string="true", everything else as JSON.
// Arguments that are not a JSON object travel whole as one string parameter named "arguments".
std::string render_arguments(const std::string& arguments) {
  ordered_json parsed = ordered_json::parse(arguments, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) parsed = ordered_json{{"arguments", arguments}};
  std::string out;
  for (const auto& [key, value] : parsed.items()) {
    if (!out.empty()) out += '\n';
    const bool is_string = value.is_string();
    out += fmt::format("<{}parameter name=\"{}\" string=\"{}\">{}</{}parameter>", kDsml, key, is_string ? "true" : "false",
                       is_string ? value.get<std::string>() : python_json_dumps(value), kDsml);
  }
  return out;
}

struct Block {
  bool is_tool_result = false;
  std::string text;
  std::string tool_use_id;
};

// A message after tool results were merged into user turns.
struct Turn {
  const Message* message = nullptr;  // role, tools, tool calls, ... of the original
  std::string role;
  std::vector<Block> blocks;         // user turns
  bool keep_reasoning = true;
};

std::vector<Turn> merge_tool_results(const std::vector<Message>& messages) {
  std::vector<Turn> turns;
  for (const Message& message : messages) {
    const bool extends_user = !turns.empty() && turns.back().role == "user";
    if (message.role == "tool") {
      Block block{true, message.content, message.tool_call_id};
      if (extends_user) turns.back().blocks.push_back(block);
      else turns.push_back(Turn{&message, "user", {block}});
    } else if (message.role == "user") {
      Block block{false, message.content, ""};
      if (extends_user) turns.back().blocks.push_back(block);
      else turns.push_back(Turn{&message, "user", {block}});
    } else {
      turns.push_back(Turn{&message, message.role, {}});
    }
  }
  return turns;
}

// Tool results in the order of the calls of the assistant turn that made them.
void order_tool_results(std::vector<Turn>& turns) {
  std::map<std::string, size_t> call_order;
  for (Turn& turn : turns) {
    if (turn.role == "assistant" && !turn.message->tool_calls.empty()) {
      call_order.clear();
      for (size_t i = 0; i < turn.message->tool_calls.size(); ++i)
        if (!turn.message->tool_calls[i].id.empty()) call_order[turn.message->tool_calls[i].id] = i;
    } else if (turn.role == "user" && !call_order.empty()) {
      std::vector<Block> results;
      for (const Block& b : turn.blocks)
        if (b.is_tool_result) results.push_back(b);
      if (results.size() < 2) continue;
      auto rank = [&](const Block& b) {
        auto it = call_order.find(b.tool_use_id);
        return it == call_order.end() ? size_t{0} : it->second;
      };
      std::stable_sort(results.begin(), results.end(), [&](const Block& a, const Block& b) { return rank(a) < rank(b); });
      size_t next = 0;
      for (Block& b : turn.blocks)
        if (b.is_tool_result) b = results[next++];
    }
  }
}

ptrdiff_t last_user_index(const std::vector<Turn>& turns) {
  for (ptrdiff_t i = static_cast<ptrdiff_t>(turns.size()) - 1; i >= 0; --i)
    if (turns[i].role == "user" || turns[i].role == "developer") return i;
  return -1;
}

// Before the last user turn, assistant turns lose their reasoning and developer turns go away.
std::vector<Turn> drop_old_thinking(std::vector<Turn> turns) {
  const ptrdiff_t last_user = last_user_index(turns);
  std::vector<Turn> kept;
  for (ptrdiff_t i = 0; i < static_cast<ptrdiff_t>(turns.size()); ++i) {
    Turn& turn = turns[i];
    const bool always_kept = turn.role == "user" || turn.role == "system" || turn.role == "latest_reminder";
    if (always_kept || i >= last_user) {
      kept.push_back(std::move(turn));
    } else if (turn.role == "assistant") {
      turn.keep_reasoning = false;
      kept.push_back(std::move(turn));
    }
  }
  return kept;
}

std::string system_extras(const Message& message) {
  std::string out;
  if (message.tools.is_array() && !message.tools.empty()) out += "\n\n" + tools_block(message.tools);
  if (!message.response_format.is_null() && !message.response_format.empty())
    out += "\n\n" + std::string(kResponseFormatIntro) + python_json_dumps(message.response_format);
  return out;
}

std::string render_turn(const std::vector<Turn>& turns, size_t index, const EncodeOptions& options, bool drop_thinking) {
  const Turn& turn = turns[index];
  const Message& message = *turn.message;
  const bool thinking = options.thinking_mode == ThinkingMode::Thinking;
  const ptrdiff_t last_user = last_user_index(turns);
  const auto position = static_cast<ptrdiff_t>(index);
  std::string out;
  if (index == 0 && thinking && options.reasoning_effort == "max") out += kReasoningEffortMax;

  if (turn.role == "system") {
    out += message.content + system_extras(message);
  } else if (turn.role == "developer") {
    if (message.content.empty()) fail("a developer message needs content");
    out += std::string(kUser) + message.content + system_extras(message);
  } else if (turn.role == "user") {
    out += kUser;
    for (size_t i = 0; i < turn.blocks.size(); ++i) {
      if (i) out += "\n\n";
      const Block& block = turn.blocks[i];
      out += block.is_tool_result ? "<tool_result>" + block.text + "</tool_result>" : block.text;
    }
  } else if (turn.role == "latest_reminder") {
    out += std::string(kLatestReminder) + message.content;
  } else if (turn.role == "assistant") {
    if (thinking && turn.keep_reasoning && (!drop_thinking || position > last_user))
      out += message.reasoning_content + std::string(kThinkEnd);
    out += message.content;
    if (!message.tool_calls.empty()) out += render_tool_calls(message.tool_calls);
    out += kEos;
  } else {
    fail("unknown message role '{}'", turn.role);
  }

  // The transition into the assistant turn belongs to the user turn before it.
  if (index + 1 < turns.size() && turns[index + 1].role != "assistant" && turns[index + 1].role != "latest_reminder")
    return out;
  if (turn.role == "user" || turn.role == "developer") {
    out += kAssistant;
    out += thinking && (!drop_thinking || position >= last_user) ? kThinkStart : kThinkEnd;
  }
  return out;
}

std::string content_text(const ordered_json& content, std::string_view where) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {
    std::string text;
    for (const ordered_json& part : content) {
      if (!part.is_object()) fail("{}: content parts must be objects", where);
      if (part.value("type", "") == "text") text += part.value("text", "");
      else fail("{}: content part type '{}' is not supported", where, part.value("type", ""));
    }
    return text;
  }
  fail("{}: content must be a string, a list of parts or null", where);
}

}  // namespace

std::string render_tool_calls(const std::vector<ToolCall>& calls) {
  std::string invokes;
  for (const ToolCall& call : calls) {
    if (!invokes.empty()) invokes += '\n';
    invokes += fmt::format("<{}invoke name=\"{}\">\n{}\n</{}invoke>", kDsml, call.name, render_arguments(call.arguments), kDsml);
  }
  return fmt::format("\n\n<{}tool_calls>\n{}\n</{}tool_calls>", kDsml, invokes, kDsml);
}

std::string encode_messages(const std::vector<Message>& messages, const EncodeOptions& options) {
  if (!options.reasoning_effort.empty() && options.reasoning_effort != "high" && options.reasoning_effort != "max")
    fail("reasoning_effort '{}' is not supported (high or max)", options.reasoning_effort);
  std::vector<Turn> turns = merge_tool_results(messages);
  order_tool_results(turns);
  // Reasoning of earlier turns is what the model needs to continue tool use, so tools keep it.
  const bool any_tools = std::any_of(messages.begin(), messages.end(),
                                     [](const Message& m) { return m.tools.is_array() && !m.tools.empty(); });
  const bool drop_thinking = options.drop_thinking && !any_tools;
  if (options.thinking_mode == ThinkingMode::Thinking && drop_thinking) turns = drop_old_thinking(std::move(turns));
  std::string prompt = options.add_bos ? std::string(kBos) : std::string();
  for (size_t i = 0; i < turns.size(); ++i) prompt += render_turn(turns, i, options, drop_thinking);
  return prompt;
}

std::vector<Message> messages_from_openai(const ordered_json& request) {
  if (!request.is_object() || !request.contains("messages") || !request["messages"].is_array())
    fail("the request needs a 'messages' list");
  std::vector<Message> messages;
  for (size_t i = 0; i < request["messages"].size(); ++i) {
    const ordered_json& item = request["messages"][i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!item.is_object() || !item.contains("role") || !item["role"].is_string()) fail("{}: needs a 'role'", where);
    Message message;
    message.role = item["role"].get<std::string>();
    static const char* const kRoles[] = {"system", "developer", "user", "assistant", "tool", "latest_reminder"};
    if (std::find(std::begin(kRoles), std::end(kRoles), message.role) == std::end(kRoles))
      fail("{}: unknown role '{}'", where, message.role);
    message.content = content_text(item.value("content", ordered_json()), where);
    if (item.contains("reasoning_content") && item["reasoning_content"].is_string())
      message.reasoning_content = item["reasoning_content"].get<std::string>();
    if (item.contains("tool_call_id") && item["tool_call_id"].is_string())
      message.tool_call_id = item["tool_call_id"].get<std::string>();
    if (item.contains("tool_calls") && item["tool_calls"].is_array()) {
      for (const ordered_json& call : item["tool_calls"]) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
          fail("{}: each tool call needs a 'function' object", where);
        const ordered_json& function = call["function"];
        ToolCall tool_call;
        tool_call.id = call.value("id", "");
        tool_call.name = function.value("name", "");
        const ordered_json arguments = function.value("arguments", ordered_json("{}"));
        tool_call.arguments = arguments.is_string() ? arguments.get<std::string>() : python_json_dumps(arguments);
        message.tool_calls.push_back(std::move(tool_call));
      }
    }
    messages.push_back(std::move(message));
  }
  if (request.contains("tools") && request["tools"].is_array() && !request["tools"].empty()) {
    auto system = std::find_if(messages.begin(), messages.end(), [](const Message& m) { return m.role == "system"; });
    if (system == messages.end()) {
      Message empty_system;
      empty_system.role = "system";
      system = messages.insert(messages.begin(), std::move(empty_system));
    }
    system->tools = request["tools"];
  }
  return messages;
}

}  // namespace dsv4::chat
