#include "serve/openai_response.h"

#include <fmt/core.h>

#include "serve/utf8.h"

namespace dsv4::openai {
namespace {

json bytes_json(std::string_view token) {
  json bytes = json::array();
  for (char c : token) bytes.push_back(static_cast<unsigned char>(c));
  return bytes;
}

// A token may be half a UTF-8 character; the text field must still be valid JSON text, the
// exact bytes are in "bytes".
std::string token_text(std::string_view token) { return utf8::repair(token); }

json finish_json(FinishReason reason) { return std::string(finish_reason_name(reason)); }

}  // namespace

std::string response_id(std::string_view prefix, uint64_t nonce) {
  // Two mixes of the nonce, so ids stay 24 hex digits long like OpenAI's.
  const uint64_t high = nonce * 0x9E3779B97F4A7C15ull ^ (nonce >> 29);
  return fmt::format("{}{:016x}{:08x}", prefix, high, static_cast<uint32_t>(nonce));
}

std::string tool_call_id(std::string_view id, size_t index) {
  const size_t dash = id.find('-');
  const std::string_view suffix = dash == std::string_view::npos ? id : id.substr(dash + 1);
  return fmt::format("call_{}_{}", suffix, index);
}

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::ToolCalls: return "tool_calls";
  }
  return "stop";
}

json usage_json(const Usage& usage) {
  json out;
  out["prompt_tokens"] = usage.prompt_tokens;
  out["completion_tokens"] = usage.completion_tokens;
  out["total_tokens"] = usage.prompt_tokens + usage.completion_tokens;
  return out;
}

json chat_logprobs_json(const std::vector<TokenLogprob>& tokens) {
  json content = json::array();
  for (const TokenLogprob& token : tokens) {
    json entry;
    entry["token"] = token_text(token.token);
    entry["logprob"] = token.logprob;
    entry["bytes"] = bytes_json(token.token);
    json top = json::array();
    for (const TopLogprob& alternative : token.top) {
      json item;
      item["token"] = token_text(alternative.token);
      item["logprob"] = alternative.logprob;
      item["bytes"] = bytes_json(alternative.token);
      top.push_back(std::move(item));
    }
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  json out;
  out["content"] = std::move(content);
  return out;
}

json completion_logprobs_json(const std::vector<TokenLogprob>& tokens, size_t first_offset) {
  json texts = json::array(), logprobs = json::array(), tops = json::array(), offsets = json::array();
  size_t offset = first_offset;
  for (const TokenLogprob& token : tokens) {
    texts.push_back(token_text(token.token));
    logprobs.push_back(token.logprob);
    json top = json::object();
    for (const TopLogprob& alternative : token.top) top[token_text(alternative.token)] = alternative.logprob;
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += token.token.size();
  }
  json out;
  out["tokens"] = std::move(texts);
  out["token_logprobs"] = std::move(logprobs);
  out["top_logprobs"] = std::move(tops);
  out["text_offset"] = std::move(offsets);
  return out;
}

json tool_call_json(const chat::ToolCall& call, std::string_view id) {
  json out;
  out["id"] = std::string(id);
  out["type"] = "function";
  out["function"]["name"] = call.name;
  out["function"]["arguments"] = call.arguments;
  return out;
}

json chat_response_json(const ResponseMeta& meta, const ChatResult& result, const Usage& usage) {
  const chat::OutputDelta& output = result.output;
  json message;
  message["role"] = "assistant";
  const bool only_tool_calls = output.content.empty() && !output.tool_calls.empty();
  message["content"] = only_tool_calls ? json() : json(output.content);
  if (!output.reasoning_content.empty()) message["reasoning_content"] = output.reasoning_content;
  if (!output.tool_calls.empty()) {
    json calls = json::array();
    for (size_t i = 0; i < output.tool_calls.size(); ++i) calls.push_back(tool_call_json(output.tool_calls[i], tool_call_id(meta.id, i)));
    message["tool_calls"] = std::move(calls);
  }
  FinishReason reason = result.finish_reason;
  if (reason == FinishReason::Stop && !output.tool_calls.empty()) reason = FinishReason::ToolCalls;
  json choice;
  choice["index"] = 0;
  choice["message"] = std::move(message);
  choice["logprobs"] = result.with_logprobs ? chat_logprobs_json(result.logprobs) : json();
  choice["finish_reason"] = finish_json(reason);
  json out;
  out["id"] = meta.id;
  out["object"] = "chat.completion";
  out["created"] = meta.created;
  out["model"] = meta.model;
  out["choices"] = json::array({std::move(choice)});
  out["usage"] = usage_json(usage);
  return out;
}

json completion_response_json(const ResponseMeta& meta, const std::vector<CompletionChoice>& choices, const Usage& usage) {
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    json choice;
    choice["index"] = i;
    choice["text"] = choices[i].text;
    choice["logprobs"] = choices[i].with_logprobs ? completion_logprobs_json(choices[i].logprobs, 0) : json();
    choice["finish_reason"] = finish_json(choices[i].finish_reason);
    list.push_back(std::move(choice));
  }
  json out;
  out["id"] = meta.id;
  out["object"] = "text_completion";
  out["created"] = meta.created;
  out["model"] = meta.model;
  out["choices"] = std::move(list);
  out["usage"] = usage_json(usage);
  return out;
}

json models_json(const std::vector<ModelCard>& models) {
  json data = json::array();
  for (const ModelCard& model : models) {
    json card;
    card["id"] = model.id;
    card["object"] = "model";
    card["created"] = model.created;
    card["owned_by"] = model.owned_by;
    card["root"] = model.root;
    card["parent"] = nullptr;
    card["max_model_len"] = model.max_model_len;
    card["permission"] = json::array();
    data.push_back(std::move(card));
  }
  json out;
  out["object"] = "list";
  out["data"] = std::move(data);
  return out;
}

}  // namespace dsv4::openai
