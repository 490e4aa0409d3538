// DeepSeek-V4 conversation encoding (SPEC.md §6; the semantics of DeepSeek's
// encoding/encoding_dsv4.py): an OpenAI-style message list becomes the prompt text, which the
// tokenizer then encodes (special-token strings in it become their ids).
//
//   BOS [reasoning-effort paragraph] system [+ "\n\n## Tools..." block]
//   <｜User｜>{user}<｜Assistant｜></think>{content}{DSML tool calls}<｜end▁of▁sentence｜>
//   <｜User｜>{user}<｜Assistant｜><think>{reasoning}</think>{content}...<｜end▁of▁sentence｜>
//   <｜User｜>{last user}<｜Assistant｜><think>          (thinking-mode generation prompt)
//
// Reasoning kept or dropped: with drop_thinking (the default, forced off when tools are defined),
// assistant turns before the last user message lose their reasoning and follow `</think>`; turns
// after it (and every turn with drop_thinking off) keep `<think>{reasoning}</think>`.
// Tool results (role "tool") are merged into the next user turn as <tool_result>...</tool_result>
// blocks, ordered like the calls of the assistant turn before them.
// Not implemented: DeepSeek's internal "task" classification turns (<｜action｜> etc.), `wo_eos`.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace dsv4::chat {

inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kDsml = "｜DSML｜";

enum class ThinkingMode { Chat, Thinking };

struct ToolCall {
  std::string id;         // OpenAI tool_call id (used to order tool results); may be empty
  std::string name;
  std::string arguments;  // JSON object text
};

struct Message {
  std::string role;  // system, developer, user, assistant, tool, latest_reminder
  std::string content;
  std::string reasoning_content;       // assistant
  std::vector<ToolCall> tool_calls;    // assistant
  std::string tool_call_id;            // tool
  nlohmann::ordered_json tools;        // system / developer: OpenAI tool list, or null
  nlohmann::ordered_json response_format;  // system / developer: JSON schema object, or null
};

struct EncodeOptions {
  ThinkingMode thinking_mode = ThinkingMode::Chat;
  bool drop_thinking = true;
  std::string reasoning_effort;  // "", "high" or "max" ("max" adds DeepSeek's paragraph in thinking mode)
  bool add_bos = true;
};

// The prompt text for `messages`. Ends with the generation prompt when the last message is a
// user (or developer) turn. Throws dsv4::Error on an unknown role or option.
std::string encode_messages(const std::vector<Message>& messages, const EncodeOptions& options);

// Messages of an OpenAI chat-completions request body ("messages", and "tools" which DeepSeek's
// format carries on the system turn: the first system message, or a new empty one in front).
// Content given as a list of parts contributes its text parts. Throws dsv4::Error on bad shapes.
std::vector<Message> messages_from_openai(const nlohmann::ordered_json& request);

// The DSML block for an assistant turn's tool calls (with its leading "\n\n").
std::string render_tool_calls(const std::vector<ToolCall>& calls);

}  // namespace dsv4::chat
