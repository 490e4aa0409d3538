// Stop strings across delta boundaries: the emitted text never contains a stop string, never
// loses text that turned out not to be one, and is the same whatever the split.
#include <gtest/gtest.h>

#include "serve/stop_matcher.h"
#include "serve/utf8.h"

namespace dsv4::openai {
namespace {

struct MatchRun {
  std::string text;
  bool stopped = false;
  std::string matched;
  std::vector<std::string> pieces;  // what each push released
};

MatchRun feed(const std::vector<std::string>& stops, const std::vector<std::string>& deltas) {
  StopStringMatcher matcher(stops);
  MatchRun run;
  for (const std::string& delta : deltas) {
    StopStringMatcher::Result result = matcher.push(delta);
    run.pieces.push_back(result.text);
    run.text += result.text;
    if (result.stopped) {
      run.stopped = true;
      run.matched = result.matched;
      break;
    }
  }
  if (!run.stopped) run.text += matcher.finish();
  return run;
}

TEST(StopMatcher, NoStops) {
  const MatchRun run = feed({}, {"a", "b"});
  EXPECT_EQ(run.text, "ab");
  EXPECT_EQ(run.pieces, (std::vector<std::string>{"a", "b"}));
}

TEST(StopMatcher, StopSpanningDeltas) {
  const MatchRun run = feed({"STOP"}, {"hello S", "T", "O", "P and more"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.matched, "STOP");
  EXPECT_EQ(run.text, "hello ");
  EXPECT_EQ(run.pieces[0], "hello ");  // "S" held back
  EXPECT_EQ(run.pieces[1], "");
}

TEST(StopMatcher, FalseStartIsReleased) {
  const MatchRun run = feed({"STOP"}, {"ST", "OX", "Y"});
  EXPECT_FALSE(run.stopped);
  EXPECT_EQ(run.text, "STOXY");
  EXPECT_EQ(run.pieces, (std::vector<std::string>{"", "STOX", "Y"}));
}

TEST(StopMatcher, HeldTextReleasedAtFinish) {
  StopStringMatcher matcher({"</end>"});
  EXPECT_EQ(matcher.push("done </e").text, "done ");
  EXPECT_EQ(matcher.finish(), "</e");
}

TEST(StopMatcher, OverlappingPrefixes) {
  // "aab" after "aaa...": the held suffix must restart inside the false start.
  EXPECT_EQ(feed({"aab"}, {"a", "a", "a", "b", "c"}).text, "a");
  EXPECT_TRUE(feed({"aab"}, {"a", "a", "a", "b"}).stopped);
  // Two stops sharing a prefix: the one that completes first (earliest position) wins.
  const MatchRun run = feed({"abcd", "bc"}, {"xa", "b", "c", "d"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.matched, "bc");
  EXPECT_EQ(run.text, "xa");
  // Both found in the same delta: the earliest position wins, not the first listed.
  const MatchRun both = feed({"world", "lo"}, {"hello world"});
  EXPECT_EQ(both.matched, "lo");
  EXPECT_EQ(both.text, "hel");
}

TEST(StopMatcher, StopAtTheVeryStart) {
  const MatchRun run = feed({"\n\n"}, {"\n", "\nrest"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.text, "");
  const MatchRun whole = feed({"Q:"}, {"Q: next"});
  EXPECT_TRUE(whole.stopped);
  EXPECT_EQ(whole.text, "");
}

TEST(StopMatcher, NothingAfterStop) {
  StopStringMatcher matcher({"x"});
  EXPECT_TRUE(matcher.push("axb").stopped);
  EXPECT_TRUE(matcher.stopped());
  EXPECT_EQ(matcher.push("more").text, "");
  EXPECT_EQ(matcher.finish(), "");
}

TEST(StopMatcher, Unicode) {
  // "停止" split byte by byte: no partial character is ever emitted.
  const std::string text = "好的。停止了";
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  const MatchRun run = feed({"停止"}, bytes);
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.text, "好的。");
  // A stop sharing its first bytes with another character ("停" = E5 81 9C, "偏" = E5 81 8F).
  const MatchRun near = feed({"停止"}, {"\xE5", "\x81", "\x8F", "x"});
  EXPECT_FALSE(near.stopped);
  EXPECT_EQ(near.text, "偏x");
  const MatchRun emoji = feed({"🛑"}, {"go 🚀 ", "🛑 no"});
  EXPECT_EQ(emoji.text, "go 🚀 ");
}

TEST(StopMatcher, AnySplitGivesTheSameResult) {
  const std::string text = "The answer is 42.\nUser: next question\nUser: again";
  const std::vector<std::string> stops = {"\nUser:", "42!", "question?"};
  const MatchRun whole = feed(stops, {text});
  ASSERT_TRUE(whole.stopped);
  EXPECT_EQ(whole.text, "The answer is 42.");
  for (size_t a = 0; a <= text.size(); ++a) {
    for (size_t b = a; b <= text.size(); b += 3) {
      const MatchRun split = feed(stops, {text.substr(0, a), text.substr(a, b - a), text.substr(b)});
      ASSERT_EQ(split.text, whole.text) << a << " " << b;
      ASSERT_EQ(split.matched, whole.matched);
    }
  }
}

}  // namespace
}  // namespace dsv4::openai
