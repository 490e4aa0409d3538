// The SSE encoders on scripted step deltas, and the non-streaming response objects.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "serve/openai_response.h"
#include "serve/openai_stream.h"

namespace dsv4::openai {
namespace {

const ResponseMeta kMeta{"chatcmpl-abc", 1700000000, "deepseek-v4"};
const std::string kToolOutput =
    "Checking.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>";

// Splits an SSE byte stream into its events' payloads, checking the framing.
std::vector<std::string> events_of(const std::string& stream) {
  std::vector<std::string> events;
  size_t position = 0;
  while (position < stream.size()) {
    EXPECT_EQ(stream.compare(position, 6, "data: "), 0) << stream.substr(position);
    const size_t end = stream.find("\n\n", position);
    EXPECT_NE(end, std::string::npos);
    if (end == std::string::npos) break;
    events.push_back(stream.substr(position + 6, end - position - 6));
    position = end + 2;
  }
  return events;
}

struct Streamed {
  std::vector<std::string> per_step;  // the SSE bytes each push returned
  std::vector<json> chunks;           // every JSON event, in order
  bool done = false;                  // [DONE] was the last event
};

Streamed stream_chat(const std::vector<std::string>& deltas, chat::ThinkingMode mode, bool include_usage,
                     FinishReason reason = FinishReason::Stop) {
  ChatStreamEncoder encoder(kMeta, mode, include_usage);
  Streamed out;
  std::string all;
  for (const std::string& delta : deltas) {
    out.per_step.push_back(encoder.push(delta));
    all += out.per_step.back();
  }
  all += encoder.finish(reason, Usage{7, static_cast<int64_t>(deltas.size())});
  const std::vector<std::string> events = events_of(all);
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i] == "[DONE]") {
      out.done = i + 1 == events.size();
      continue;
    }
    out.chunks.push_back(json::parse(events[i]));
  }
  return out;
}

std::string concat(const Streamed& s, const char* field) {
  std::string text;
  for (const json& chunk : s.chunks)
    if (!chunk["choices"].empty() && chunk["choices"][0]["delta"].contains(field)) text += chunk["choices"][0]["delta"][field];
  return text;
}

TEST(ChatStream, PlainText) {
  const Streamed s = stream_chat({"Hel", "lo", " world", "<｜end▁of▁sentence｜>"}, chat::ThinkingMode::Chat, false);
  EXPECT_TRUE(s.done);
  ASSERT_EQ(s.chunks.size(), 4u);  // three text steps + the finish chunk
  for (size_t i = 0; i < 3; ++i) EXPECT_FALSE(s.per_step[i].empty()) << "one chunk per step, flushed at once";
  const json& first = s.chunks[0];
  EXPECT_EQ(first["id"], "chatcmpl-abc");
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["created"], 1700000000);
  EXPECT_EQ(first["model"], "deepseek-v4");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "Hel");  // the role comes with the first token
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(first.contains("usage"));
  for (size_t i = 1; i < s.chunks.size(); ++i) EXPECT_FALSE(s.chunks[i]["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(concat(s, "content"), "Hello world");
  EXPECT_EQ(s.chunks.back()["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(s.chunks.back()["choices"][0]["delta"].empty());
}

TEST(ChatStream, NoEmptyChunkBeforeTheFirstToken) {
  // The first steps are all held back (a possible marker): nothing may be sent for them.
  const Streamed s = stream_chat({"<", "｜end", "▁of", "x"}, chat::ThinkingMode::Chat, false);
  EXPECT_TRUE(s.per_step[0].empty());
  EXPECT_TRUE(s.per_step[1].empty());
  EXPECT_TRUE(s.per_step[2].empty());
  EXPECT_EQ(s.chunks[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(s.chunks[0]["choices"][0]["delta"]["content"], "<｜end▁ofx");
  // Nothing generated at all: the finish chunk carries the role.
  const Streamed empty = stream_chat({}, chat::ThinkingMode::Chat, false, FinishReason::Length);
  ASSERT_EQ(empty.chunks.size(), 1u);
  EXPECT_EQ(empty.chunks[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(empty.chunks[0]["choices"][0]["finish_reason"], "length");
}

TEST(ChatStream, ThinkingSeparatesReasoning) {
  const Streamed s = stream_chat({"Let me", " think.</th", "ink>The", " answer.", "<｜end▁of▁sentence｜>"},
                                 chat::ThinkingMode::Thinking, false);
  EXPECT_EQ(concat(s, "reasoning_content"), "Let me think.");
  EXPECT_EQ(concat(s, "content"), "The answer.");
  for (const json& chunk : s.chunks) {
    const json& delta = chunk["choices"][0]["delta"];
    EXPECT_FALSE(delta.contains("reasoning_content") && delta.contains("content")) << "reasoning and content in separate chunks";
  }
  EXPECT_EQ(s.chunks[0]["choices"][0]["delta"]["reasoning_content"], "Let me");
  EXPECT_EQ(s.chunks[0]["choices"][0]["delta"]["role"], "assistant");
}

TEST(ChatStream, ToolCallSplitIntoTinyDeltas) {
  for (size_t piece : {1, 2, 3, 5, 7}) {
    std::vector<std::string> deltas;
    for (size_t i = 0; i < kToolOutput.size(); i += piece) deltas.push_back(kToolOutput.substr(i, piece));
    const Streamed s = stream_chat(deltas, chat::ThinkingMode::Chat, false);
    ASSERT_TRUE(s.done);
    std::vector<json> calls;
    for (const json& chunk : s.chunks) {
      const json& delta = chunk["choices"][0]["delta"];
      if (delta.contains("content")) {
        const std::string content = delta["content"];
        for (const char* markup : {"<", "｜", "DSML", "\xEF", "invoke", "\n\n"})
          EXPECT_EQ(content.find(markup), std::string::npos) << "markup byte in content: '" << content << "' piece " << piece;
      }
      if (delta.contains("tool_calls"))
        for (const json& call : delta["tool_calls"]) calls.push_back(call);
    }
    EXPECT_EQ(concat(s, "content"), "Checking.");
    ASSERT_EQ(calls.size(), 2u);
    EXPECT_EQ(calls[0]["index"], 0);
    EXPECT_EQ(calls[0]["id"], "call_abc_0");
    EXPECT_EQ(calls[0]["type"], "function");
    EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(json::parse(calls[0]["function"]["arguments"].get<std::string>()), json::parse(R"({"city": "Paris", "days": 2})"));
    EXPECT_EQ(calls[1]["index"], 1);
    EXPECT_EQ(calls[1]["function"]["name"], "now");
    EXPECT_EQ(calls[1]["function"]["arguments"], "{}");
    EXPECT_EQ(s.chunks.back()["choices"][0]["finish_reason"], "tool_calls");
  }
}

TEST(ChatStream, IncludeUsageAndDone) {
  const Streamed s = stream_chat({"a", "b"}, chat::ThinkingMode::Chat, true, FinishReason::Length);
  EXPECT_TRUE(s.done);
  ASSERT_EQ(s.chunks.size(), 4u);
  for (size_t i = 0; i + 1 < s.chunks.size(); ++i) EXPECT_TRUE(s.chunks[i]["usage"].is_null());
  EXPECT_EQ(s.chunks[2]["choices"][0]["finish_reason"], "length");
  const json& usage_chunk = s.chunks[3];
  EXPECT_TRUE(usage_chunk["choices"].is_array() && usage_chunk["choices"].empty());
  EXPECT_EQ(usage_chunk["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(usage_chunk["usage"]["completion_tokens"], 2);
  EXPECT_EQ(usage_chunk["usage"]["total_tokens"], 9);
  EXPECT_EQ(usage_chunk["id"], "chatcmpl-abc");
}

TEST(ChatStream, LogprobsRideOnTheNextChunk) {
  ChatStreamEncoder encoder(kMeta, chat::ThinkingMode::Chat, false);
  EXPECT_EQ(encoder.push("<", {{"<", -0.5, {{"<", -0.5}, {"a", -1.5}}}}), "");  // held back
  const std::vector<std::string> events = events_of(encoder.push("b", {{"b", -0.25, {}}}));
  ASSERT_EQ(events.size(), 1u);
  const json chunk = json::parse(events[0]);
  const json& content = chunk["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "<");
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], "a");
  EXPECT_EQ(content[1]["logprob"], -0.25);
  EXPECT_EQ(content[1]["bytes"], json::array({98}));
}

TEST(ChatStream, MidStreamError) {
  const std::vector<std::string> events = events_of(sse_error(unavailable("engine stopped")));
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(json::parse(events[0])["error"]["message"], "engine stopped");
  EXPECT_EQ(events[1], "[DONE]");
}

TEST(CompletionStream, ChunksUsageDone) {
  const ResponseMeta meta{"cmpl-1", 5, "m"};
  CompletionStreamEncoder encoder(meta, 0, true);
  std::string all = encoder.push("Hi");
  all += encoder.push("");
  all += encoder.push(" there", {{" there", -0.1, {{" there", -0.1}}}});
  all += encoder.finish(FinishReason::Length);
  all += sse_usage_chunk(meta, "text_completion", {3, 2}) + std::string(kSseDone);
  const std::vector<std::string> events = events_of(all);
  ASSERT_EQ(events.size(), 5u);
  const json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "text_completion");
  EXPECT_EQ(first["choices"][0]["text"], "Hi");
  EXPECT_TRUE(first["choices"][0]["logprobs"].is_null());
  const json second = json::parse(events[1]);
  EXPECT_EQ(second["choices"][0]["logprobs"]["text_offset"], json::array({2}));
  EXPECT_EQ(second["choices"][0]["logprobs"]["top_logprobs"][0][" there"], -0.1);
  EXPECT_EQ(json::parse(events[2])["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(json::parse(events[3])["usage"]["total_tokens"], 5);
  EXPECT_EQ(events[4], "[DONE]");
}

TEST(OpenAiResponse, ChatCompletion) {
  ChatResult result;
  result.output = chat::OutputParser::parse("Hmm.</think>" + kToolOutput, chat::ThinkingMode::Thinking);
  const json response = chat_response_json(kMeta, result, {10, 20});
  EXPECT_EQ(response["object"], "chat.completion");
  const json& choice = response["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], "Checking.");
  EXPECT_EQ(choice["message"]["reasoning_content"], "Hmm.");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 2u);
  EXPECT_EQ(choice["message"]["tool_calls"][1]["id"], "call_abc_1");
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["logprobs"].is_null());
  EXPECT_EQ(response["usage"], json::parse(R"({"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30})"));

  ChatResult plain;
  plain.output.content = "hi";
  plain.finish_reason = FinishReason::Length;
  const json short_response = chat_response_json(kMeta, plain, {1, 1});
  EXPECT_EQ(short_response["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(short_response["choices"][0]["message"].contains("reasoning_content"));
  EXPECT_FALSE(short_response["choices"][0]["message"].contains("tool_calls"));

  ChatResult only_calls;
  only_calls.output = chat::OutputParser::parse(kToolOutput.substr(kToolOutput.find("\n\n")), chat::ThinkingMode::Chat);
  EXPECT_TRUE(chat_response_json(kMeta, only_calls, {})["choices"][0]["message"]["content"].is_null());
}

TEST(OpenAiResponse, TextCompletionAndInvalidUtf8) {
  std::vector<CompletionChoice> choices(2);
  choices[0].text = "one";
  choices[1].text = "bad \xff byte";
  choices[1].finish_reason = FinishReason::Length;
  choices[1].with_logprobs = true;
  choices[1].logprobs = {{"\xe4\xbd", -1.0, {}}};  // half a character
  const json response = completion_response_json({"cmpl-x", 1, "m"}, choices, {4, 6});
  EXPECT_EQ(response["choices"][1]["index"], 1);
  EXPECT_EQ(response["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(response["choices"][1]["logprobs"]["tokens"][0], "\xEF\xBF\xBD");
  const std::string text = dump_json(response);  // must not throw
  EXPECT_NE(text.find("bad \xEF\xBF\xBD byte"), std::string::npos);
}

TEST(OpenAiResponse, ModelsAndIds) {
  const json models = models_json({{"deepseek-v4", 123, "dsv4", "/models/v4", 8192}});
  EXPECT_EQ(models["object"], "list");
  const json& card = models["data"][0];
  EXPECT_EQ(card["id"], "deepseek-v4");
  EXPECT_EQ(card["object"], "model");
  EXPECT_EQ(card["created"], 123);
  EXPECT_EQ(card["owned_by"], "dsv4");
  EXPECT_EQ(card["root"], "/models/v4");
  EXPECT_EQ(card["max_model_len"], 8192);
  const std::string id = response_id("chatcmpl-", 42);
  EXPECT_EQ(id.size(), 9u + 24u);
  EXPECT_NE(id, response_id("chatcmpl-", 43));
  EXPECT_EQ(tool_call_id(id, 2), "call_" + id.substr(9) + "_2");
}

}  // namespace
}  // namespace dsv4::openai
