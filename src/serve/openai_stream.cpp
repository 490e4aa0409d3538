#include "serve/openai_stream.h"

namespace dsv4::openai {

std::string sse_event(const json& value) { return "data: " + dump_json(value) + "\n\n"; }

std::string sse_error(const ApiError& error) { return sse_event(error_json(error)) + std::string(kSseDone); }

std::string sse_usage_chunk(const ResponseMeta& meta, std::string_view object, const Usage& usage) {
  json out;
  out["id"] = meta.id;
  out["object"] = std::string(object);
  out["created"] = meta.created;
  out["model"] = meta.model;
  out["choices"] = json::array();
  out["usage"] = usage_json(usage);
  return sse_event(out);
}

ChatStreamEncoder::ChatStreamEncoder(ResponseMeta meta, chat::ThinkingMode mode, bool include_usage)
    : meta_(std::move(meta)), parser_(mode), include_usage_(include_usage) {}

std::string ChatStreamEncoder::chunk(json delta, json finish_reason) {
  if (!role_sent_) {
    json with_role;
    with_role["role"] = "assistant";
    for (auto& [key, value] : delta.items()) with_role[key] = std::move(value);
    delta = std::move(with_role);
    role_sent_ = true;
  }
  json choice;
  choice["index"] = 0;
  choice["delta"] = std::move(delta);
  if (logprobs_wanted_) {
    choice["logprobs"] = chat_logprobs_json(pending_logprobs_);
    pending_logprobs_.clear();
    logprobs_wanted_ = false;
  } else {
    choice["logprobs"] = nullptr;
  }
  choice["finish_reason"] = std::move(finish_reason);
  json out;
  out["id"] = meta_.id;
  out["object"] = "chat.completion.chunk";
  out["created"] = meta_.created;
  out["model"] = meta_.model;
  out["choices"] = json::array({std::move(choice)});
  if (include_usage_) out["usage"] = nullptr;
  return sse_event(out);
}

std::string ChatStreamEncoder::emit(chat::OutputDelta delta) {
  std::string events;
  if (!delta.reasoning_content.empty()) {
    json d;
    d["reasoning_content"] = delta.reasoning_content;
    events += chunk(std::move(d), nullptr);
  }
  if (!delta.content.empty()) {
    json d;
    d["content"] = delta.content;
    events += chunk(std::move(d), nullptr);
  }
  if (!delta.tool_calls.empty()) {
    json calls = json::array();
    for (const chat::ToolCall& call : delta.tool_calls) {
      // OpenAI's delta shape: the call's index first, then the fields of a message's tool call.
      json item;
      item["index"] = tool_calls_sent_;
      json fields = tool_call_json(call, tool_call_id(meta_.id, tool_calls_sent_));
      for (auto& [key, value] : fields.items()) item[key] = std::move(value);
      calls.push_back(std::move(item));
      ++tool_calls_sent_;
    }
    json d;
    d["tool_calls"] = std::move(calls);
    events += chunk(std::move(d), nullptr);
  }
  output_.append(std::move(delta));
  return events;
}

std::string ChatStreamEncoder::push(std::string_view text, std::vector<TokenLogprob> logprobs) {
  if (!logprobs.empty()) {
    logprobs_wanted_ = true;
    for (TokenLogprob& token : logprobs) pending_logprobs_.push_back(std::move(token));
  }
  return emit(parser_.push(text));
}

std::string ChatStreamEncoder::finish(FinishReason reason, const Usage& usage) {
  std::string events = emit(parser_.finish());
  if (reason == FinishReason::Stop && tool_calls_sent_ > 0) reason = FinishReason::ToolCalls;
  // The final delta is empty, except for the role when nothing at all was generated.
  events += chunk(json::object(), std::string(finish_reason_name(reason)));
  if (include_usage_) events += sse_usage_chunk(meta_, "chat.completion.chunk", usage);
  events += kSseDone;
  return events;
}

CompletionStreamEncoder::CompletionStreamEncoder(ResponseMeta meta, size_t index, bool include_usage)
    : meta_(std::move(meta)), index_(index), include_usage_(include_usage) {}

std::string CompletionStreamEncoder::chunk(std::string_view text, const std::vector<TokenLogprob>* logprobs, json finish_reason) {
  json choice;
  choice["index"] = index_;
  choice["text"] = std::string(text);
  choice["logprobs"] = logprobs != nullptr ? completion_logprobs_json(*logprobs, text_offset_) : json();
  choice["finish_reason"] = std::move(finish_reason);
  text_offset_ += text.size();
  json out;
  out["id"] = meta_.id;
  out["object"] = "text_completion";
  out["created"] = meta_.created;
  out["model"] = meta_.model;
  out["choices"] = json::array({std::move(choice)});
  if (include_usage_) out["usage"] = nullptr;
  return sse_event(out);
}

std::string CompletionStreamEncoder::push(std::string_view text, std::vector<TokenLogprob> logprobs) {
  if (text.empty() && logprobs.empty()) return {};
  return chunk(text, logprobs.empty() ? nullptr : &logprobs, nullptr);
}

std::string CompletionStreamEncoder::finish(FinishReason reason) {
  return chunk("", nullptr, std::string(finish_reason_name(reason)));
}

}  // namespace dsv4::openai
