// `dsv4 chat` driven through a pseudo-terminal as a user would (typed lines, Ctrl-C, Ctrl-D), and
// `dsv4 generate --chat`, on a random-weight model with the default tokenizer (make-tiny). The
// model's words are random; what is checked is the conversation's mechanics.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "pty_session.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using test::PtySession;

// One tiny model with a tokenizer for every test here (two layers: a reply of a few tokens is fast).
const std::string& model_dir() {
  static const std::string dir = [] {
    const std::string d = test::fresh_dir("chat_command") + "/model";
    const test::CommandResult r = test::run_dsv4("make-tiny --seed 5 --set num_hidden_layers=2 --out " + d);
    if (r.rc != 0) ADD_FAILURE() << r.out;
    return d;
  }();
  return dir;
}

// Types `line` and waits for the next prompt ("> " at the start of a line) after it.
void say(PtySession& s, const std::string& line) {
  const size_t from = s.size();
  s.send(line + "\r");
  ASSERT_TRUE(s.wait_for("\n> ", from)) << "no prompt after '" << line << "':\n" << s.output();
}

std::string since(const PtySession& s, size_t from) { return s.output().substr(std::min(from, s.size())); }

TEST(ChatCommand, TwoTurnsResetAndThinking) {
  PtySession s("chat --model " + model_dir() + " --max-tokens 4");
  ASSERT_TRUE(s.wait_for("Ctrl-D or /exit quits.")) << s.output();
  ASSERT_TRUE(s.wait_for("> ")) << s.output();

  say(s, "Hello there");
  size_t at = s.size();
  say(s, "/stats");
  EXPECT_NE(since(s, at).find("stopped after 4 tokens (--max-tokens)"), std::string::npos) << since(s, at);
  EXPECT_NE(since(s, at).find("conversation: 1 turn,"), std::string::npos) << since(s, at);

  say(s, "And a second question");
  at = s.size();
  say(s, "/stats");
  EXPECT_NE(since(s, at).find("conversation: 2 turns,"), std::string::npos) << since(s, at);

  at = s.size();
  say(s, "/reset");
  EXPECT_NE(since(s, at).find("(the conversation is cleared)"), std::string::npos) << since(s, at);
  at = s.size();
  say(s, "/stats");
  EXPECT_NE(since(s, at).find("conversation: 0 turns, 0 of 1048576 context tokens"), std::string::npos) << since(s, at);

  at = s.size();
  say(s, "/think on");
  EXPECT_NE(since(s, at).find("(thinking on)"), std::string::npos) << since(s, at);
  at = s.size();
  say(s, "Think first");
  // Thinking mode: the reply starts inside the reasoning, shown apart with its label.
  EXPECT_NE(since(s, at).find("thinking: "), std::string::npos) << since(s, at);
  at = s.size();
  say(s, "/nonsense");
  EXPECT_NE(since(s, at).find("unknown command /nonsense (/help lists the commands)"), std::string::npos) << since(s, at);

  s.send("/exit\r");
  EXPECT_EQ(s.wait_exit(), 0) << s.output();
}

TEST(ChatCommand, CtrlCStopsAReplyAndTheChatGoesOn) {
  PtySession s("chat --model " + model_dir() + " --max-tokens 1000000");
  ASSERT_TRUE(s.wait_for("Ctrl-D or /exit quits.")) << s.output();
  ASSERT_TRUE(s.wait_for("> ")) << s.output();
  s.send("Tell me a long story\r");
  ASSERT_TRUE(s.wait_for("story\r\n")) << s.output();
  ASSERT_TRUE(s.wait_for_size(s.size() + 8)) << "the reply did not stream:\n" << s.output();  // a million tokens would take hours
  size_t at = s.size();
  s.interrupt();
  ASSERT_TRUE(s.wait_for("[interrupted]", at)) << s.output();
  ASSERT_TRUE(s.wait_for("\n> ", at)) << s.output();

  at = s.size();
  say(s, "/stats");
  EXPECT_NE(since(s, at).find("stopped by Ctrl-C after "), std::string::npos) << since(s, at);
  EXPECT_NE(since(s, at).find("conversation: 1 turn,"), std::string::npos) << since(s, at);  // the partial reply is kept

  // Ctrl-C at the prompt does not quit; Ctrl-D does.
  at = s.size();
  s.interrupt();
  ASSERT_TRUE(s.wait_for("(Ctrl-D or /exit quits)", at)) << s.output();
  ASSERT_TRUE(s.wait_for("> ", at)) << s.output();
  s.end_of_input();
  EXPECT_EQ(s.wait_exit(), 0) << s.output();
}

TEST(ChatCommand, OldTurnsAreDroppedToFitTheContext) {
  // Each turn adds about 13 tokens (the message, the markup, a 4-token reply): a context of 40
  // holds two or three of them, so by the sixth turn the oldest ones must have gone.
  PtySession s("chat --model " + model_dir() + " --max-tokens 4 --context 40");
  ASSERT_TRUE(s.wait_for("(context 40 tokens")) << s.output();
  ASSERT_TRUE(s.wait_for("> ")) << s.output();
  const size_t start = s.size();
  for (int turn = 0; turn < 6; ++turn) say(s, "tell me about the number " + std::to_string(turn));
  EXPECT_NE(since(s, start).find("dropped to fit the context of 40 tokens)"), std::string::npos) << since(s, start);
  const size_t at = s.size();
  say(s, "/stats");
  const std::string stats = since(s, at);
  EXPECT_EQ(stats.find("conversation: 6 turns"), std::string::npos) << stats;
  const size_t of = stats.find(" of 40 context tokens");
  ASSERT_NE(of, std::string::npos) << stats;
  const size_t number = stats.rfind(' ', of - 1) + 1;
  EXPECT_LE(std::stoi(stats.substr(number, of - number)), 40) << stats;
  s.send("/exit\r");
  EXPECT_EQ(s.wait_exit(), 0) << s.output();
}

TEST(GenerateChat, EncodesAConversationAndSeparatesTheReasoning) {
  test::SplitResult r = test::run_dsv4_split("generate --model " + model_dir() + " --prompt Hello --chat -n 3 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  // BOS <｜User｜>Hello<｜Assistant｜></think>: 5 tokens, against 1 for the raw text.
  EXPECT_EQ(j["prompt_tokens"], 5);
  EXPECT_TRUE(j.contains("content") && j.contains("reasoning_content")) << r.out;
  EXPECT_EQ(j["reasoning_content"], "");  // chat mode: no reasoning

  r = test::run_dsv4_split("generate --model " + model_dir() + " --prompt Hello --chat --think -n 3 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_tokens"], 5);  // ... <｜Assistant｜><think>
  EXPECT_NE(j["reasoning_content"], "");  // the output starts inside the reasoning (random weights never close it)

  r = test::run_dsv4_split("generate --model " + model_dir() + " --prompt Hello -n 3 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["prompt_tokens"], 1);
}

TEST(GenerateChat, IdsPastTheTokenizerAreValidModelIds) {
  // 128,846..129,279: in the model's vocabulary (129,280), not in the tokenizer's.
  test::SplitResult r = test::run_dsv4_split("generate --model " + model_dir() + " --prompt-ids 5,128846,129279 -n 2 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["prompt_tokens"], 3);
  r = test::run_dsv4_split("generate --model " + model_dir() + " --prompt-ids 5,129280 -n 2");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("error: token id 129280 is outside the vocabulary (0 to 129279)"), std::string::npos) << r.err;
  r = test::run_dsv4_split("detokenize --model " + model_dir() + " 19923,129000");
  EXPECT_EQ(r.out, "Hello<id:129000>");
  r = test::run_dsv4_split("tokenize --model " + model_dir() + " Hello");
  EXPECT_EQ(r.out, "19923\n");
}

}  // namespace
}  // namespace dsv4
