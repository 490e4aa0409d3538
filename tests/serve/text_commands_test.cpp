// `dsv4 tokenize` / `dsv4 detokenize` through the real binary.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

struct Result {
  int exit_code;
  std::string output;  // stdout and stderr
};

Result run(const std::string& arguments) {
  const std::string command = std::string(DSV4_BINARY) + " " + arguments + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  std::string output;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

const std::string kSpecText = "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>";
const std::string kSpecIds = "128803,30594,128804,128821,36101,128822,7624,1";

TEST(TextCommands, TokenizeArgumentFileAndStdin) {
  EXPECT_EQ(run("tokenize '" + kSpecText + "'").output, kSpecIds + "\n");
  const auto file = std::filesystem::temp_directory_path() / "dsv4_text_commands_test.txt";
  std::ofstream(file, std::ios::binary) << kSpecText;
  EXPECT_EQ(run("tokenize --file " + file.string()).output, kSpecIds + "\n");
  EXPECT_EQ(run("tokenize < " + file.string()).output, kSpecIds + "\n");
  std::filesystem::remove(file);
  EXPECT_EQ(run("tokenize ''").output, "\n");
}

TEST(TextCommands, DetokenizePrintsTheTextExactly) {
  EXPECT_EQ(run("detokenize " + kSpecIds).output, kSpecText);
  EXPECT_EQ(run("detokenize '[19923, 3]'").output, "Hello!");
  const auto file = std::filesystem::temp_directory_path() / "dsv4_text_commands_test_ids.txt";
  std::ofstream(file) << "19923,3\n";
  EXPECT_EQ(run("detokenize < " + file.string()).output, "Hello!");
  std::filesystem::remove(file);
}

TEST(TextCommands, BadInputIsAClearError) {
  Result r = run("detokenize 1,999999");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("error: token id 999999"), std::string::npos) << r.output;
  r = run("detokenize 1,x");  // a bad argument is a usage error
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("'x' is not a token id"), std::string::npos) << r.output;
  // The id-list syntax generate uses: an empty item is an error (from an argument or stdin).
  r = run("detokenize 1,,2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("error: IDS: an empty item in '1,,2'"), std::string::npos) << r.output;
  const auto file = std::filesystem::temp_directory_path() / "dsv4_text_commands_test_bad_ids.txt";
  std::ofstream(file) << "1,,2\n";
  r = run("detokenize < " + file.string());
  std::filesystem::remove(file);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("error: standard input: an empty item in '1,,2"), std::string::npos) << r.output;
  r = run("tokenize --tokenizer /nonexistent/dir hello");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("cannot read tokenizer file"), std::string::npos) << r.output;
  r = run("tokenize --file /etc/hostname word");
  EXPECT_NE(r.exit_code, 0);
}

// Ids past the tokenizer (128,846 with the default one) but inside DeepSeek-V4's vocabulary
// (129,280) are the embedding's padding rows: printed as <id:N>, as generate and chat print them.
TEST(TextCommands, IdsPastTheTokenizerArePrintedAsMarkers) {
  EXPECT_EQ(run("detokenize 19923,128846,129279,3").output, "Hello<id:128846><id:129279>!");
  const Result r = run("detokenize 129280");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("error: token id 129280 is outside the vocabulary (ids below 129280)"), std::string::npos) << r.output;
}

TEST(TextCommands, HelpDescribesTheCommands) {
  const Result r = run("tokenize --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("no BOS/EOS"), std::string::npos) << r.output;
}

}  // namespace
