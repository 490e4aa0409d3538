// The model-output parser: reasoning, content and DSML tool calls, and the streaming guarantee:
// fed in any split (every byte boundary, or one byte at a time) the streamed pieces add up to the
// whole-text parse, every piece is valid UTF-8, and no markup reaches the streamed content.
#include <gtest/gtest.h>

#include "serve/chat_output_parser.h"
#include "serve/utf8.h"

namespace dsv4::chat {
namespace {

struct Sample {
  std::string text;
  ThinkingMode mode;
};

const std::vector<Sample>& samples() {
  static const std::vector<Sample> list = {
      {"Let me think.\n</think>The answer is 42.<｜end▁of▁sentence｜>", ThinkingMode::Thinking},
      {"Need weather.</think>Checking.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
       "<｜DSML｜parameter name=\"city\" string=\"true\">Paris \"centre\"</｜DSML｜parameter>\n"
       "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
       "<｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>",
       ThinkingMode::Thinking},
      {"a < b\n\nc <｜ d ｜DSML x 😀 </thin <think> 中文\n<｜end▁of▁sent\n\n<｜end▁of▁sentence｜>ignored", ThinkingMode::Chat},
      {"\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"false\">[1, "
       "{\"y\": null}]</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
       ThinkingMode::Chat},
      {"no end of sentence, ends with newlines\n\n", ThinkingMode::Chat},
      {"reasoning that never closes 🤔", ThinkingMode::Thinking},
      {"x\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"true\">cut off",
       ThinkingMode::Chat},
  };
  return list;
}

void expect_same(const OutputDelta& a, const OutputDelta& b, const std::string& what) {
  EXPECT_EQ(a.reasoning_content, b.reasoning_content) << what;
  EXPECT_EQ(a.content, b.content) << what;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << what;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << what;
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << what;
  }
}

void check_piece(const OutputDelta& piece, const std::string& what) {
  EXPECT_TRUE(utf8::is_valid(piece.content)) << what;
  EXPECT_TRUE(utf8::is_valid(piece.reasoning_content)) << what;
  for (std::string_view markup : {"｜DSML｜", "</think>", "<｜end▁of▁sentence｜>"})
    EXPECT_EQ(piece.content.find(markup), std::string::npos) << what;
}

TEST(OutputParser, WholeTextParses) {
  const OutputDelta plain = OutputParser::parse(samples()[0].text, ThinkingMode::Thinking);
  EXPECT_EQ(plain.reasoning_content, "Let me think.\n");
  EXPECT_EQ(plain.content, "The answer is 42.");
  EXPECT_TRUE(plain.tool_calls.empty());

  OutputParser parser(ThinkingMode::Thinking);
  OutputDelta tools = parser.push(samples()[1].text);
  tools.append(parser.finish());
  EXPECT_TRUE(parser.error().empty()) << parser.error();
  EXPECT_TRUE(parser.saw_eos());
  EXPECT_EQ(tools.reasoning_content, "Need weather.");
  EXPECT_EQ(tools.content, "Checking.");
  ASSERT_EQ(tools.tool_calls.size(), 2u);
  EXPECT_EQ(tools.tool_calls[0].name, "get_weather");
  EXPECT_EQ(tools.tool_calls[0].arguments, R"({"city": "Paris \"centre\"", "days": 2})");
  EXPECT_EQ(tools.tool_calls[1].name, "now");
  EXPECT_EQ(tools.tool_calls[1].arguments, "{}");

  const OutputDelta chat = OutputParser::parse(samples()[2].text, ThinkingMode::Chat);
  EXPECT_EQ(chat.content, "a < b\n\nc <｜ d ｜DSML x 😀 </thin <think> 中文\n<｜end▁of▁sent\n\n");
  const OutputDelta json_argument = OutputParser::parse(samples()[3].text, ThinkingMode::Chat);
  EXPECT_EQ(json_argument.content, "");
  ASSERT_EQ(json_argument.tool_calls.size(), 1u);
  EXPECT_EQ(json_argument.tool_calls[0].arguments, R"({"x": [1, {"y": null}]})");
}

TEST(OutputParser, MalformedToolCallsAreReportedNotLeaked) {
  OutputParser parser(ThinkingMode::Chat);
  OutputDelta delta = parser.push(samples()[6].text);
  delta.append(parser.finish());
  EXPECT_EQ(delta.content, "x");
  EXPECT_TRUE(delta.tool_calls.empty());
  EXPECT_FALSE(parser.error().empty());
}

TEST(OutputParser, EverySplitPointGivesTheWholeTextResult) {
  for (const Sample& sample : samples()) {
    const OutputDelta whole = OutputParser::parse(sample.text, sample.mode);
    for (size_t split = 0; split <= sample.text.size(); ++split) {
      OutputParser parser(sample.mode);
      OutputDelta streamed;
      for (std::string_view part : {std::string_view(sample.text).substr(0, split), std::string_view(sample.text).substr(split)}) {
        OutputDelta piece = parser.push(part);
        check_piece(piece, sample.text);
        streamed.append(std::move(piece));
      }
      streamed.append(parser.finish());
      expect_same(streamed, whole, "split at " + std::to_string(split) + " of: " + sample.text);
    }
  }
}

TEST(OutputParser, OneByteAtATimeGivesTheWholeTextResult) {
  for (const Sample& sample : samples()) {
    OutputParser parser(sample.mode);
    OutputDelta streamed;
    for (char c : sample.text) {
      OutputDelta piece = parser.push(std::string_view(&c, 1));
      check_piece(piece, sample.text);
      streamed.append(std::move(piece));
    }
    streamed.append(parser.finish());
    expect_same(streamed, OutputParser::parse(sample.text, sample.mode), sample.text);
  }
}

TEST(OutputParser, ContentIsNotHeldBackLongerThanNeeded) {
  OutputParser parser(ThinkingMode::Chat);
  EXPECT_EQ(parser.push("Hello wor").content, "Hello wor");
  EXPECT_EQ(parser.push("ld <").content, "ld ");   // '<' may open markup
  EXPECT_EQ(parser.push("b>").content, "<b>");      // it did not
  EXPECT_EQ(parser.push("\n\n").content, "");       // may introduce tool calls
  EXPECT_EQ(parser.push("ok").content, "\n\nok");
}

TEST(OutputParser, RenderedToolCallsParseBack) {
  const std::vector<ToolCall> calls = {{"", "search", R"({"query": "dsv4 \"fast\"", "limit": 5, "exact": false})"}};
  const OutputDelta parsed = OutputParser::parse("Sure." + render_tool_calls(calls) + "<｜end▁of▁sentence｜>", ThinkingMode::Chat);
  EXPECT_EQ(parsed.content, "Sure.");
  ASSERT_EQ(parsed.tool_calls.size(), 1u);
  EXPECT_EQ(parsed.tool_calls[0].name, "search");
  EXPECT_EQ(parsed.tool_calls[0].arguments, calls[0].arguments);
}

}  // namespace
}  // namespace dsv4::chat
