// Request bodies of /v1/chat/completions and /v1/completions: good ones with the typed values
// they give, bad ones with the status and parameter of the 400.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "serve/openai_request.h"

namespace dsv4::openai {
namespace {

const RequestLimits kLimits{.max_model_len = 4096, .vocab_size = 1000};

struct BadCase {
  const char* body;
  const char* param;            // expected "param" ("" = null)
  const char* message_part;     // a fragment the message must contain
};

void expect_bad_chat(const BadCase& c) {
  const Parsed<ChatRequest> parsed = parse_chat_request(c.body, kLimits);
  ASSERT_FALSE(parsed.ok()) << c.body;
  ASSERT_TRUE(parsed.error.has_value());
  EXPECT_EQ(http_status(parsed.error->kind), 400) << c.body;
  EXPECT_EQ(parsed.error->param, c.param) << c.body << " → " << parsed.error->message;
  EXPECT_NE(parsed.error->message.find(c.message_part), std::string::npos) << c.body << " → " << parsed.error->message;
  const nlohmann::ordered_json body = error_json(*parsed.error);
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(body["error"].contains("code"));
}

constexpr const char* kHello = R"("messages": [{"role": "user", "content": "hi"}])";

std::string chat(const std::string& extra) { return std::string("{") + kHello + (extra.empty() ? "" : ", " + extra) + "}"; }

TEST(OpenAiRequest, ChatDefaults) {
  const Parsed<ChatRequest> parsed = parse_chat_request(chat(R"("model": "dsv4")"), kLimits);
  ASSERT_TRUE(parsed.ok()) << parsed.error->message;
  const ChatRequest& r = *parsed.value;
  EXPECT_EQ(r.model, "dsv4");
  EXPECT_FALSE(r.params.max_tokens.has_value());
  EXPECT_EQ(r.params.temperature, 1.0);
  EXPECT_EQ(r.params.top_k, -1);
  EXPECT_FALSE(r.params.stream);
  EXPECT_EQ(r.encode.thinking_mode, chat::ThinkingMode::Chat);
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.prompt, chat::encode_messages(r.messages, r.encode));
  EXPECT_NE(r.prompt.find("hi"), std::string::npos);
}

TEST(OpenAiRequest, ChatGoodTable) {
  struct GoodCase {
    std::string body;
    std::function<void(const ChatRequest&)> check;
  };
  const std::vector<GoodCase> cases = {
      {chat(R"("max_tokens": 10, "max_completion_tokens": 20)"), [](const ChatRequest& r) { EXPECT_EQ(r.params.max_tokens, 20); }},
      {chat(R"("max_tokens": 10)"), [](const ChatRequest& r) { EXPECT_EQ(r.params.max_tokens, 10); }},
      {chat(R"("max_tokens": 16.0)"), [](const ChatRequest& r) { EXPECT_EQ(r.params.max_tokens, 16); }},
      {chat(R"("max_tokens": null, "temperature": null)"), [](const ChatRequest& r) {
         EXPECT_FALSE(r.params.max_tokens);
         EXPECT_EQ(r.params.temperature, 1.0);
       }},
      {chat(R"("temperature": 0, "top_p": 0.5, "top_k": 0, "min_p": 0.1, "seed": -7)"), [](const ChatRequest& r) {
         EXPECT_EQ(r.params.temperature, 0.0);
         EXPECT_EQ(r.params.top_p, 0.5);
         EXPECT_EQ(r.params.top_k, -1);
         EXPECT_EQ(r.params.min_p, 0.1);
         EXPECT_EQ(r.params.seed, -7);
       }},
      {chat(R"("top_k": 40, "min_tokens": 3, "max_tokens": 5, "ignore_eos": true)"), [](const ChatRequest& r) {
         EXPECT_EQ(r.params.top_k, 40);
         EXPECT_EQ(r.params.min_tokens, 3);
         EXPECT_TRUE(r.params.ignore_eos);
       }},
      {chat(R"("stop": "END")"), [](const ChatRequest& r) { EXPECT_EQ(r.params.stop, std::vector<std::string>{"END"}); }},
      {chat(R"("stop": ["a", "", "bc"], "stop_token_ids": [1, 999])"), [](const ChatRequest& r) {
         EXPECT_EQ(r.params.stop, (std::vector<std::string>{"a", "bc"}));
         EXPECT_EQ(r.params.stop_token_ids, (std::vector<int32_t>{1, 999}));
       }},
      {chat(R"("presence_penalty": -2, "frequency_penalty": 2, "repetition_penalty": 1.3)"), [](const ChatRequest& r) {
         EXPECT_EQ(r.params.presence_penalty, -2);
         EXPECT_EQ(r.params.frequency_penalty, 2);
         EXPECT_EQ(r.params.repetition_penalty, 1.3);
       }},
      {chat(R"("logprobs": true, "top_logprobs": 5)"), [](const ChatRequest& r) {
         EXPECT_TRUE(r.params.logprobs);
         EXPECT_EQ(r.params.top_logprobs, 5);
       }},
      {chat(R"("stream": true, "stream_options": {"include_usage": true})"), [](const ChatRequest& r) {
         EXPECT_TRUE(r.params.stream);
         EXPECT_TRUE(r.params.include_usage);
       }},
      {chat(R"("n": 1, "best_of": 1, "user": "x", "some_future_field": {"a": [1]})"), [](const ChatRequest&) {}},
      {chat(R"("chat_template_kwargs": {"thinking": true})"), [](const ChatRequest& r) {
         EXPECT_EQ(r.encode.thinking_mode, chat::ThinkingMode::Thinking);
         EXPECT_EQ(r.prompt.substr(r.prompt.size() - 7), "<think>");
       }},
      {chat(R"("chat_template_kwargs": {"enable_thinking": false, "drop_thinking": false}, "reasoning_effort": "max")"),
       [](const ChatRequest& r) {
         EXPECT_EQ(r.encode.thinking_mode, chat::ThinkingMode::Chat);
         EXPECT_FALSE(r.encode.drop_thinking);
         EXPECT_EQ(r.encode.reasoning_effort, "max");
       }},
      {chat(R"("response_format": {"type": "text"})"), [](const ChatRequest& r) { EXPECT_TRUE(r.messages[0].response_format.is_null()); }},
      {chat(R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}})"),
       [](const ChatRequest& r) {
         ASSERT_EQ(r.messages[0].role, "system");
         EXPECT_EQ(r.messages[0].response_format["name"], "x");
       }},
  };
  for (const GoodCase& c : cases) {
    const Parsed<ChatRequest> parsed = parse_chat_request(c.body, kLimits);
    ASSERT_TRUE(parsed.ok()) << c.body << " → " << parsed.error->message;
    c.check(*parsed.value);
  }
}

TEST(OpenAiRequest, ChatMessagesAndTools) {
  const std::string body = R"({
    "messages": [
      {"role": "system", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
      {"role": "user", "content": "weather?", "name": "bob"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
      {"role": "user", "content": "thanks"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "tool_choice": "auto", "parallel_tool_calls": true})";
  const Parsed<ChatRequest> parsed = parse_chat_request(body, kLimits);
  ASSERT_TRUE(parsed.ok()) << parsed.error->message;
  const ChatRequest& r = *parsed.value;
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[0].content, "be brief");
  EXPECT_TRUE(r.messages[0].tools.is_array());
  ASSERT_EQ(r.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[2].tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.messages[2].tool_calls[0].id, "call_1");
  EXPECT_EQ(r.messages[3].tool_call_id, "call_1");
  EXPECT_NE(r.prompt.find("get_weather"), std::string::npos);
  EXPECT_NE(r.prompt.find("sunny"), std::string::npos);

  // tool_choice "none": the tools stay out of the prompt.
  const std::string none = R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "none",
    "tools": [{"type": "function", "function": {"name": "secret_tool"}}]})";
  const Parsed<ChatRequest> without = parse_chat_request(none, kLimits);
  ASSERT_TRUE(without.ok()) << without.error->message;
  EXPECT_EQ(without.value->tool_choice, ToolChoice::None);
  EXPECT_EQ(without.value->prompt.find("secret_tool"), std::string::npos);
}

TEST(OpenAiRequest, MalformedBodies) {
  const std::vector<BadCase> cases = {
      {"", "", "not valid JSON"},
      {"{\"messages\": [", "", "not valid JSON"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]", "", "not valid JSON"},
      {"[1, 2]", "", "must be a JSON object"},
      {"\"text\"", "", "must be a JSON object"},
      {"null", "", "must be a JSON object"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}", "", "not valid JSON"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"\xc3\"}]}", "", "not valid JSON"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"\\ud800\"}]}", "", "not valid JSON"},
  };
  for (const BadCase& c : cases) expect_bad_chat(c);
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  expect_bad_chat({deep.c_str(), "", "deeper than"});
}

TEST(OpenAiRequest, ChatBadTable) {
  const std::vector<std::pair<std::string, BadCase>> cases = {
      {"{}", {"", "messages", "required"}},
      {R"({"messages": "hi"})", {"", "messages", "must be a list"}},
      {R"({"messages": []})", {"", "messages", "must not be empty"}},
      {R"({"messages": [1]})", {"", "messages[0]", "must be an object"}},
      {R"({"messages": [{"content": "hi"}]})", {"", "messages[0].role", "required"}},
      {R"({"messages": [{"role": "robot", "content": "hi"}]})", {"", "messages[0].role", "robot"}},
      {R"({"messages": [{"role": "user"}]})", {"", "messages[0].content", "required"}},
      {R"({"messages": [{"role": "user", "content": 5}]})", {"", "messages[0].content", "string or a list"}},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})",
       {"", "messages[0].content[0].type", "image_url"}},
      {R"({"messages": [{"role": "tool", "content": "r"}]})", {"", "messages[0].tool_call_id", "required"}},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}]}]})",
       {"", "messages[0].tool_calls[0].function.arguments", "JSON object"}},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]})",
       {"", "messages[0].tool_calls[0].function.name", "required"}},
      {chat(R"("model": 3)"), {"", "model", "must be a string"}},
      {chat(R"("max_tokens": 0)"), {"", "max_tokens", "at least 1"}},
      {chat(R"("max_tokens": -5)"), {"", "max_tokens", "at least 1"}},
      {chat(R"("max_tokens": "10")"), {"", "max_tokens", "must be an integer"}},
      {chat(R"("max_tokens": 1.5)"), {"", "max_tokens", "must be an integer"}},
      {chat(R"("max_tokens": 99999999999999999999)"), {"", "max_tokens", "must be an integer"}},
      {chat(R"("max_tokens": 18446744073709551615)"), {"", "max_tokens", "too large"}},
      {chat(R"("max_completion_tokens": 0)"), {"", "max_completion_tokens", "at least 1"}},
      {chat(R"("min_tokens": 10, "max_tokens": 5)"), {"", "min_tokens", "less than or equal"}},
      {chat(R"("temperature": 2.5)"), {"", "temperature", "[0, 2]"}},
      {chat(R"("temperature": -0.1)"), {"", "temperature", "[0, 2]"}},
      {chat(R"("temperature": "hot")"), {"", "temperature", "must be a number"}},
      {chat(R"("top_p": 0)"), {"", "top_p", "(0, 1]"}},
      {chat(R"("top_p": 1.01)"), {"", "top_p", "(0, 1]"}},
      {chat(R"("top_k": -2)"), {"", "top_k", "at least -1"}},
      {chat(R"("min_p": 2)"), {"", "min_p", "[0, 1]"}},
      {chat(R"("seed": "x")"), {"", "seed", "integer"}},
      {chat(R"("n": 2)"), {"", "n", "not supported"}},
      {chat(R"("n": 0)"), {"", "n", "at least 1"}},
      {chat(R"("best_of": 3)"), {"", "best_of", "not supported"}},
      {chat(R"("stop": 5)"), {"", "stop", "string or a list"}},
      {chat(R"("stop": ["a", 5])"), {"", "stop[1]", "must be a string"}},
      {chat(R"("stop_token_ids": [1, 1000])"), {"", "stop_token_ids[1]", "out of vocabulary"}},
      {chat(R"("stop_token_ids": [-1])"), {"", "stop_token_ids[0]", "out of vocabulary"}},
      {chat(R"("stop_token_ids": 3)"), {"", "stop_token_ids", "list"}},
      {chat(R"("ignore_eos": "yes")"), {"", "ignore_eos", "boolean"}},
      {chat(R"("presence_penalty": 3)"), {"", "presence_penalty", "[-2, 2]"}},
      {chat(R"("frequency_penalty": -2.5)"), {"", "frequency_penalty", "[-2, 2]"}},
      {chat(R"("repetition_penalty": 0)"), {"", "repetition_penalty", "greater than 0"}},
      {chat(R"("logprobs": 1)"), {"", "logprobs", "boolean"}},
      {chat(R"("top_logprobs": 3)"), {"", "top_logprobs", "needs 'logprobs'"}},
      {chat(R"("logprobs": true, "top_logprobs": 21)"), {"", "top_logprobs", "[0, 20]"}},
      {chat(R"("stream": "true")"), {"", "stream", "boolean"}},
      {chat(R"("stream_options": {"include_usage": true})"), {"", "stream_options", "only be given when 'stream'"}},
      {chat(R"("stream": true, "stream_options": {"include_usage": 1})"), {"", "stream_options.include_usage", "boolean"}},
      {chat(R"("stream": true, "stream_options": [])"), {"", "stream_options", "must be an object"}},
      {chat(R"("tools": {})"), {"", "tools", "must be a list"}},
      {chat(R"("tools": [{"type": "retrieval"}])"), {"", "tools[0].type", "'function'"}},
      {chat(R"("tools": [{"type": "function", "function": {"description": "x"}}])"), {"", "tools[0].function.name", "required"}},
      {chat(R"("tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}])"),
       {"", "tools[0].function.parameters", "schema"}},
      {chat(R"("tool_choice": "required")"), {"", "tool_choice", "not supported"}},
      {chat(R"("tool_choice": {"type": "function", "function": {"name": "f"}})"), {"", "tool_choice", "not supported"}},
      {chat(R"("tool_choice": "sometimes")"), {"", "tool_choice", "sometimes"}},
      {chat(R"("chat_template_kwargs": true)"), {"", "chat_template_kwargs", "object"}},
      {chat(R"("chat_template_kwargs": {"thinking": "on"})"), {"", "chat_template_kwargs.thinking", "boolean"}},
      {chat(R"("reasoning_effort": "low")"), {"", "reasoning_effort", "'high' or 'max'"}},
      {chat(R"("response_format": {"type": "json_object"})"), {"", "response_format", "json_object"}},
      {chat(R"("response_format": {"type": "yaml"})"), {"", "response_format.type", "yaml"}},
      {chat(R"("response_format": {"type": "json_schema"})"), {"", "response_format.json_schema", "object"}},
  };
  for (const auto& [body, c] : cases) expect_bad_chat({body.c_str(), c.param, c.message_part});
}

TEST(OpenAiRequest, CompletionPrompts) {
  struct GoodCase {
    std::string body;
    std::function<void(const CompletionRequest&)> check;
  };
  const std::vector<GoodCase> cases = {
      {R"({"prompt": "Once"})", [](const CompletionRequest& r) {
         ASSERT_EQ(r.prompts.size(), 1u);
         EXPECT_EQ(r.prompts[0].text, "Once");
         EXPECT_FALSE(r.prompts[0].is_tokens);
         EXPECT_EQ(r.params.max_tokens, 16);  // the completions default
       }},
      {R"({"prompt": ["a", "b"], "max_tokens": 4})", [](const CompletionRequest& r) {
         ASSERT_EQ(r.prompts.size(), 2u);
         EXPECT_EQ(r.prompts[1].text, "b");
         EXPECT_EQ(r.params.max_tokens, 4);
       }},
      {R"({"prompt": [1, 2, 3]})", [](const CompletionRequest& r) {
         ASSERT_EQ(r.prompts.size(), 1u);
         EXPECT_TRUE(r.prompts[0].is_tokens);
         EXPECT_EQ(r.prompts[0].token_ids, (std::vector<int32_t>{1, 2, 3}));
       }},
      {R"({"prompt": [[1, 2], [3]], "echo": true, "logprobs": 3})", [](const CompletionRequest& r) {
         ASSERT_EQ(r.prompts.size(), 2u);
         EXPECT_EQ(r.prompts[1].token_ids, std::vector<int32_t>{3});
         EXPECT_TRUE(r.echo);
         EXPECT_TRUE(r.params.logprobs);
         EXPECT_EQ(r.params.top_logprobs, 3);
       }},
      {R"({"prompt": "x", "logprobs": 0, "max_completion_tokens": 99})", [](const CompletionRequest& r) {
         EXPECT_TRUE(r.params.logprobs);
         EXPECT_EQ(r.params.top_logprobs, 0);
         EXPECT_EQ(r.params.max_tokens, 16);  // max_completion_tokens is a chat field: ignored here
       }},
  };
  for (const GoodCase& c : cases) {
    const Parsed<CompletionRequest> parsed = parse_completion_request(c.body, kLimits);
    ASSERT_TRUE(parsed.ok()) << c.body << " → " << parsed.error->message;
    c.check(*parsed.value);
  }
}

TEST(OpenAiRequest, CompletionBadTable) {
  const std::vector<BadCase> cases = {
      {R"({})", "prompt", "required"},
      {R"({"prompt": ""})", "prompt", "must not be empty"},
      {R"({"prompt": []})", "prompt", "must not be empty"},
      {R"({"prompt": 5})", "prompt", "must be a string"},
      {R"({"prompt": ["a", 1]})", "prompt[1]", "must be a string"},
      {R"({"prompt": [[1], "a"]})", "prompt[1]", "not a mixture"},
      {R"({"prompt": [[1], []]})", "prompt[1]", "must not be empty"},
      {R"({"prompt": [1, 5000]})", "prompt[1]", "out of vocabulary"},
      {R"({"prompt": [1, 2.5]})", "prompt[1]", "integer"},
      {R"({"prompt": "x", "logprobs": true})", "logprobs", "integer"},
      {R"({"prompt": "x", "logprobs": 30})", "logprobs", "[0, 20]"},
      {R"({"prompt": "x", "suffix": "tail"})", "suffix", "not supported"},
      {R"({"prompt": "x", "echo": 1})", "echo", "boolean"},
      {R"({"prompt": "x", "n": 3})", "n", "not supported"},
      {"{\"prompt\": \"\xed\xa0\x80\"}", "", "not valid JSON"},  // an encoded surrogate
  };
  for (const BadCase& c : cases) {
    const Parsed<CompletionRequest> parsed = parse_completion_request(c.body, kLimits);
    ASSERT_FALSE(parsed.ok()) << c.body;
    EXPECT_EQ(parsed.error->param, c.param) << c.body << " → " << parsed.error->message;
    EXPECT_NE(parsed.error->message.find(c.message_part), std::string::npos) << c.body << " → " << parsed.error->message;
  }
}

TEST(OpenAiRequest, FitContext) {
  GenerationParams open;
  EXPECT_FALSE(fit_context(open, 1000, 4096, "messages"));
  EXPECT_EQ(open.max_tokens, 3096);

  GenerationParams exact;
  exact.max_tokens = 96;
  EXPECT_FALSE(fit_context(exact, 4000, 4096, "prompt"));

  GenerationParams too_many;
  too_many.max_tokens = 1000000000000;
  const auto error = fit_context(too_many, 10, 4096, "messages");
  ASSERT_TRUE(error);
  EXPECT_EQ(http_status(error->kind), 400);
  EXPECT_EQ(error->param, "max_tokens");
  EXPECT_EQ(error->code, "context_length_exceeded");
  EXPECT_EQ(error->message,
            "'max_tokens' or 'max_completion_tokens' is too large: 1000000000000. This model's maximum context length is 4096 "
            "tokens and your request has 10 input tokens (1000000000000 > 4096 - 10).");

  GenerationParams long_prompt;
  const auto prompt_error = fit_context(long_prompt, 5000, 4096, "prompt");
  ASSERT_TRUE(prompt_error);
  EXPECT_EQ(prompt_error->param, "prompt");
  EXPECT_EQ(prompt_error->message,
            "This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens. Please reduce the "
            "length of the input messages.");

  GenerationParams min_over;
  min_over.min_tokens = 200;
  const auto min_error = fit_context(min_over, 4000, 4096, "prompt");
  ASSERT_TRUE(min_error);
  EXPECT_EQ(min_error->param, "min_tokens");
}

TEST(OpenAiRequest, ErrorStatusesAndShape) {
  EXPECT_EQ(http_status(ErrorKind::BadRequest), 400);
  EXPECT_EQ(http_status(ErrorKind::Unauthorized), 401);
  EXPECT_EQ(http_status(ErrorKind::NotFound), 404);
  EXPECT_EQ(http_status(ErrorKind::TooLarge), 413);
  EXPECT_EQ(http_status(ErrorKind::Unavailable), 503);
  EXPECT_EQ(error_body(bad_request("bad", "top_p")),
            R"({"error":{"message":"bad","type":"invalid_request_error","param":"top_p","code":null}})");
  const nlohmann::ordered_json missing = error_json(model_not_found("gpt-4"));
  EXPECT_EQ(missing["error"]["code"], "model_not_found");
  EXPECT_EQ(missing["error"]["param"], "model");
  EXPECT_EQ(error_json(unauthorized())["error"]["code"], "invalid_api_key");
  EXPECT_TRUE(error_json(route_not_found("GET", "/nope"))["error"]["param"].is_null());
  EXPECT_EQ(error_json(body_too_large(1024))["error"]["code"], "request_too_large");
  EXPECT_EQ(error_json(unavailable("loading"))["error"]["type"], "server_error");
}

}  // namespace
}  // namespace dsv4::openai
