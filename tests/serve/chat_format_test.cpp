// DeepSeek-V4 prompt encoding against the worked examples of SPEC.md §6 (byte-exact strings, and
// ids from Hugging Face's tokenizer), plus the rules around them: generation prompts, dropped
// reasoning, reasoning effort, tools, DSML tool calls and merged tool results.
#include <gtest/gtest.h>

#include "core/error.h"
#include "serve/chat_format.h"
#include "tokenizer_test_util.h"

namespace dsv4::chat {
namespace {

Message msg(std::string role, std::string content, std::string reasoning = "") {
  Message m;
  m.role = std::move(role);
  m.content = std::move(content);
  m.reasoning_content = std::move(reasoning);
  return m;
}

EncodeOptions thinking_options() {
  EncodeOptions options;
  options.thinking_mode = ThinkingMode::Thinking;
  return options;
}

// SPEC.md §6, the example from a test on a V4-family tokenizer.
TEST(ChatFormat, SpecExampleOne) {
  EncodeOptions options = thinking_options();
  options.add_bos = false;
  const std::string prompt = encode_messages({msg("user", "你好"), msg("assistant", "答案", "推理")}, options);
  EXPECT_EQ(prompt, "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>");
  EXPECT_EQ(testing::default_tokenizer().encode(prompt),
            (std::vector<TokenId>{128803, 30594, 128804, 128821, 36101, 128822, 7624, 1}));
}

// SPEC.md §6 test vector 2 (DeepSeek's encoding/tests/test_output_2.txt); the reasoning text in
// the middle is elided in the spec, this one is ours. Ids from Hugging Face's tokenizer.
TEST(ChatFormat, SpecExampleTwoDropsEarlierReasoning) {
  const std::vector<Message> messages = {
      msg("system", "You are a helpful assistant."),
      msg("user", "Hello"),
      msg("assistant", "Hi there! How can I help you?", "Greeting; no reasoning needed."),
      msg("user", "What is the capital of France?"),
      msg("assistant", "The capital of France is Paris.", "The user asks for the capital of France. That is Paris."),
  };
  const std::string prompt = encode_messages(messages, thinking_options());
  EXPECT_EQ(prompt,
            "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>Hello<｜Assistant｜></think>Hi there! How can "
            "I help you?<｜end▁of▁sentence｜><｜User｜>What is the capital of France?<｜Assistant｜><think>The user asks "
            "for the capital of France. That is Paris.</think>The capital of France is Paris.<｜end▁of▁sentence｜>");
  const std::vector<TokenId> expected = {
      0,     3476,  477,   260,   11502, 22896, 16,    128803, 19923, 128804, 128822, 23166, 1031,  3,
      1730,  588,   342,   1694,  440,   33,    1,     128803, 3085,  344,    270,    6102,  294,   8760,
      33,    128804, 128821, 671,  3967,  20407, 362,   270,    6102,  294,    8760,   16,    3841,  344,
      11111, 16,    128822, 671,  6102,  294,   8760,  344,    11111, 16,     1};
  EXPECT_EQ(testing::default_tokenizer().encode(prompt), expected);
}

TEST(ChatFormat, GenerationPrompts) {
  const std::vector<Message> messages = {msg("system", "S"), msg("user", "hi")};
  EXPECT_EQ(encode_messages(messages, {}), "<｜begin▁of▁sentence｜>S<｜User｜>hi<｜Assistant｜></think>");
  EXPECT_EQ(encode_messages(messages, thinking_options()), "<｜begin▁of▁sentence｜>S<｜User｜>hi<｜Assistant｜><think>");
  // A conversation ending with the assistant has no generation prompt.
  EXPECT_EQ(encode_messages({msg("user", "a"), msg("assistant", "b")}, {}),
            "<｜begin▁of▁sentence｜><｜User｜>a<｜Assistant｜></think>b<｜end▁of▁sentence｜>");
}

TEST(ChatFormat, ChatModeNeverRendersReasoning) {
  const std::string prompt = encode_messages({msg("user", "a"), msg("assistant", "b", "secret"), msg("user", "c")}, {});
  EXPECT_EQ(prompt,
            "<｜begin▁of▁sentence｜><｜User｜>a<｜Assistant｜></think>b<｜end▁of▁sentence｜><｜User｜>c<｜Assistant｜></think>");
}

TEST(ChatFormat, KeepingThinkingRendersEveryReasoning) {
  EncodeOptions options = thinking_options();
  options.drop_thinking = false;
  const std::string prompt = encode_messages({msg("user", "a"), msg("assistant", "b", "r1"), msg("user", "c")}, options);
  EXPECT_EQ(prompt,
            "<｜begin▁of▁sentence｜><｜User｜>a<｜Assistant｜><think>r1</think>b<｜end▁of▁sentence｜><｜User｜>c"
            "<｜Assistant｜><think>");
}

TEST(ChatFormat, ReasoningEffortMaxPrependsDeepSeeksParagraph) {
  EncodeOptions options = thinking_options();
  options.reasoning_effort = "max";
  const std::string prompt = encode_messages({msg("system", "S"), msg("user", "q")}, options);
  EXPECT_EQ(prompt,
            "<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
            "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
            "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
            "scenarios.\nExplicitly write out your entire deliberation process, documenting every intermediate step, "
            "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
            "S<｜User｜>q<｜Assistant｜><think>");
  // Only thinking mode uses it; "high" adds nothing; anything else is refused.
  options.thinking_mode = ThinkingMode::Chat;
  EXPECT_EQ(encode_messages({msg("user", "q")}, options), "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜></think>");
  options.reasoning_effort = "extreme";
  EXPECT_THROW(encode_messages({msg("user", "q")}, options), Error);
}

const char* const kWeatherRequest = R"({
  "messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {"role": "assistant", "content": "", "reasoning_content": "Call the tool twice.",
     "tool_calls": [
       {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}},
       {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"days\": 1}"}}]},
    {"role": "tool", "tool_call_id": "c2", "content": "Oslo: -3C"},
    {"role": "tool", "tool_call_id": "c1", "content": "Paris: 12C"},
    {"role": "user", "content": "Thanks"}
  ],
  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                            "required": ["city"]}}}]
})";

TEST(ChatFormat, ToolsToolCallsAndToolResults) {
  const auto messages = messages_from_openai(nlohmann::ordered_json::parse(kWeatherRequest));
  const std::string prompt = encode_messages(messages, thinking_options());
  const std::string expected =
      "<｜begin▁of▁sentence｜>Be brief.\n\n## Tools\n\n"
      "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
      "\"<｜DSML｜tool_calls>\" block like the following:\n\n"
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
      "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n"
      "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\n"
      "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, "
      "arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
      "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
      "<think>...</think> BEFORE any tool calls or final response.\n\n"
      "Otherwise, output directly after </think> with tool calls or final response.\n\n"
      "### Available Tool Schemas\n\n"
      "{\"name\": \"get_weather\", \"description\": \"Weather for a city\", \"parameters\": {\"type\": \"object\", "
      "\"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}}, \"required\": [\"city\"]}}"
      "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
      "<｜User｜>Weather in Paris and Oslo?<｜Assistant｜><think>Call the tool twice.</think>\n\n"
      "<｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Oslo</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">1</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
      // Tool results join the next user turn, in call order (c1 before c2), then the user's text.
      "<｜User｜><tool_result>Paris: 12C</tool_result>\n\n<tool_result>Oslo: -3C</tool_result>\n\nThanks"
      "<｜Assistant｜><think>";
  EXPECT_EQ(prompt, expected);
}

TEST(ChatFormat, ToolsWithoutASystemMessageGetAnEmptyOne) {
  nlohmann::ordered_json request = nlohmann::ordered_json::parse(kWeatherRequest);
  request["messages"].erase(0);
  const auto messages = messages_from_openai(request);
  ASSERT_EQ(messages.front().role, "system");
  EXPECT_EQ(encode_messages(messages, {}).rfind("<｜begin▁of▁sentence｜>\n\n## Tools\n\n", 0), 0u);
}

TEST(ChatFormat, ArgumentsThatAreNotAnObjectTravelAsOneString) {
  ToolCall call{"", "f", "not json"};
  EXPECT_EQ(render_tool_calls({call}),
            "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
            "<｜DSML｜parameter name=\"arguments\" string=\"true\">not json</｜DSML｜parameter>\n"
            "</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
}

TEST(ChatFormat, OpenAiShapes) {
  const auto messages = messages_from_openai(nlohmann::ordered_json::parse(
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                       {"role": "assistant", "content": null, "tool_calls": [{"id": "x", "type": "function",
                        "function": {"name": "f", "arguments": {"k": [1, 2.5]}}}]}]})"));
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[0].content, "ab");
  EXPECT_EQ(messages[1].tool_calls.at(0).arguments, "{\"k\": [1, 2.5]}");
  EXPECT_THROW(messages_from_openai(nlohmann::ordered_json::parse(R"({"messages": [{"role": "wizard"}]})")), Error);
  EXPECT_THROW(messages_from_openai(nlohmann::ordered_json::parse(R"({"messages": 3})")), Error);
  EXPECT_THROW(messages_from_openai(nlohmann::ordered_json::parse(
                   R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})")),
               Error);
}

TEST(ChatFormat, ConsecutiveUserMessagesJoinLikeDeepSeeks) {
  EXPECT_EQ(encode_messages({msg("user", "a"), msg("user", "b")}, {}),
            "<｜begin▁of▁sentence｜><｜User｜>a\n\nb<｜Assistant｜></think>");
}

}  // namespace
}  // namespace dsv4::chat
