// Token-for-token parity with Hugging Face's tokenizer library on DeepSeek's tokenizer.json, over
// the vectors scripts/tokenizer/make_parity_vectors.mjs wrote; and decode(encode(s)) == s.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "serve/tokenizer.h"
#include "tokenizer_test_util.h"

namespace dsv4 {
namespace {

using nlohmann::json;

struct ParityCase {
  std::string category, text;
  std::vector<TokenId> ids;
};

struct ParityVectors {
  json header;
  std::vector<ParityCase> cases;
};

ParityVectors read_vectors() {
  std::istringstream lines(testing::read_test_file("tokenizer/parity.jsonl"));
  ParityVectors vectors;
  std::string line;
  std::getline(lines, line);
  vectors.header = json::parse(line);
  while (std::getline(lines, line)) {
    const json row = json::parse(line);
    vectors.cases.push_back({row["category"], row["text"], row["ids"].get<std::vector<TokenId>>()});
  }
  return vectors;
}

std::string describe_difference(const std::vector<TokenId>& expected, const std::vector<TokenId>& actual) {
  size_t first = 0;
  while (first < expected.size() && first < actual.size() && expected[first] == actual[first]) ++first;
  auto window = [first](const std::vector<TokenId>& ids) {
    const size_t begin = first > 3 ? first - 3 : 0, end = std::min(ids.size(), first + 5);
    return fmt::format("{}", fmt::join(ids.begin() + begin, ids.begin() + end, ","));
  };
  return fmt::format("first difference at id #{} (expected {} ids, got {}): expected ...{}..., got ...{}...", first,
                     expected.size(), actual.size(), window(expected), window(actual));
}

TEST(TokenizerParity, SpecialTokensMatchTheReferenceSetup) {
  const ParityVectors vectors = read_vectors();
  const json& recorded = vectors.header.at("added_special_tokens");
  const auto ours = deepseek_v4_special_tokens();
  ASSERT_EQ(recorded.size(), ours.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_EQ(recorded[i][0].get<std::string>(), ours[i].content);
    EXPECT_EQ(recorded[i][1].get<TokenId>(), ours[i].id);
    EXPECT_EQ(testing::default_tokenizer().token_to_id(ours[i].content), ours[i].id);
  }
}

TEST(TokenizerParity, EveryIdOfEveryStringMatchesHuggingFace) {
  const ParityVectors vectors = read_vectors();
  ASSERT_GE(vectors.cases.size(), 2000u);
  const Tokenizer& tokenizer = testing::default_tokenizer();
  size_t mismatches = 0, round_trip_failures = 0, ids_checked = 0;
  for (size_t i = 0; i < vectors.cases.size(); ++i) {
    const ParityCase& c = vectors.cases[i];
    const std::vector<TokenId> ids = tokenizer.encode(c.text);
    ids_checked += c.ids.size();
    if (ids != c.ids) {
      if (++mismatches <= 10)
        ADD_FAILURE() << "string " << i << " (" << c.category << ", " << c.text.size()
                      << " bytes): " << describe_difference(c.ids, ids) << "\ntext: " << c.text.substr(0, 200);
    }
    if (tokenizer.decode(c.ids) != c.text && ++round_trip_failures <= 10)
      ADD_FAILURE() << "string " << i << " (" << c.category << ") does not round-trip";
  }
  fmt::print("parity: {} strings, {} ids, {} mismatching strings, {} round-trip failures\n", vectors.cases.size(),
             ids_checked, mismatches, round_trip_failures);
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(round_trip_failures, 0u);
}

// SPEC.md §6 example, from a test on a V4-family tokenizer.
TEST(TokenizerParity, SpecExample) {
  const std::string text = "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>";
  const std::vector<TokenId> expected = {128803, 30594, 128804, 128821, 36101, 128822, 7624, 1};
  EXPECT_EQ(testing::default_tokenizer().encode(text), expected);
  EXPECT_EQ(testing::default_tokenizer().decode(expected), text);
}

}  // namespace
}  // namespace dsv4
