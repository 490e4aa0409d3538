// The command line as a user meets it: every case of the CLI issue list with its message and exit
// status (2: the command line is wrong, 1: the run failed, 130: stopped by Ctrl-C), and the
// streaming / Ctrl-C behaviour of `generate` on a pseudo-terminal. Needs no tokenizer: the model is
// tests/data/golden/tiny-a (vocabulary 1,024, no tokenizer.json).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "pty_session.h"
#include "test_util.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;
using test::CommandResult;

const std::string kModel = std::string(DSV4_TEST_DATA) + "/golden/tiny-a";

CommandResult dsv4(const std::string& args) { return test::run_dsv4(args); }

// Exit status `rc` and every piece of `expected` in the output.
void expect_result(const CommandResult& r, int rc, std::initializer_list<std::string> expected) {
  EXPECT_EQ(r.rc, rc) << r.out;
  for (const std::string& piece : expected) EXPECT_NE(r.out.find(piece), std::string::npos) << "missing '" << piece << "' in:\n" << r.out;
}

TEST(Cli, VersionNamesCommitBuildAndCuda) {
  const CommandResult r = dsv4("--version");
  expect_result(r, 0, {"dsv4 0.1.0", "commit: ", "build: ", "cuda backend: "});
}

TEST(Cli, UnknownOrMissingCommandIsNamed) {
  expect_result(dsv4("frobnicate"), 2, {"error: 'frobnicate' is not a dsv4 command", "generate, chat", "dsv4 --help"});
  expect_result(dsv4(""), 2, {"error: give a command: inspect, make-tiny, generate, chat"});
  expect_result(dsv4("generate --model " + kModel + " --bogus"), 2,
                {"error: the following argument was not expected: --bogus", "see 'dsv4 generate --help'"});
}

TEST(Cli, HelpShowsDefaults) {
  CommandResult r = dsv4("generate --help");
  expect_result(r, 0, {"--max-tokens INT:1 to 2^30=32", "--temperature FLOAT:0 to 100=0", "--top-p FLOAT:0 to 1=1",
                       "--top-k INT:0 to 2^24=0", "--seed UINT:0 to 2^64-1=0", "--backend TEXT:{cpu,cuda}=cpu",
                       "--prefill-chunk", "=2048", "<id:N>"});
  r = dsv4("chat --help");
  expect_result(r, 0, {"--max-tokens INT:1 to 2^30=2048", "--temperature FLOAT:0 to 100=0", "--context", "/reset", "/think on|off"});
  expect_result(dsv4("--help"), 0, {"--threads", "default: one per core", "--version"});
  expect_result(dsv4("make-tiny --help"), 0, {"--experts-format TEXT:{mxfp4,nvfp4}=mxfp4", "--seed UINT:0 to 2^64-1=1", "--force"});
  expect_result(dsv4("layer-check --help"), 0, {"--chunk INT:0 to 2^24=0", "--backend TEXT:{cpu,cuda}=cpu"});
  expect_result(dsv4("detokenize --help"), 0, {"--model", "<id:N>", "\"1,,2\" is an error"});
}

TEST(Cli, SamplingParametersAreValidated) {
  const std::string gen = "generate --model " + kModel + " --prompt-ids 1,2 -n 1";
  expect_result(dsv4(gen + " --temperature nan"), 2,
                {"error: --temperature: expected a number from 0 to 100 (0 = greedy), got 'nan'", "see 'dsv4 generate --help'"});
  expect_result(dsv4(gen + " --temperature inf"), 2, {"error: --temperature: expected a number from 0 to 100"});
  expect_result(dsv4(gen + " --top-p nan"), 2, {"error: --top-p: expected a number from 0 to 1 (1 = off), got 'nan'"});
  expect_result(dsv4(gen + " --min-p 2"), 2, {"error: --min-p: expected a number from 0 to 1 (0 = off), got '2'"});
  expect_result(dsv4(gen + " --top-k -1"), 2, {"error: --top-k: expected an integer from 0 to 2^24 (0 = off), got '-1'"});
  expect_result(dsv4(gen + " --seed -3"), 2, {"error: --seed: expected an integer from 0 to 2^64 - 1, got '-3'"});
  expect_result(dsv4(gen + " --seed 18446744073709551616"), 2, {"error: --seed: expected an integer"});
  expect_result(dsv4(gen + " -n 0"), 2, {"error: --max-tokens: expected an integer from 1 to 2^30, got '0'"});
  expect_result(dsv4(gen + " --backend gpu"), 2, {"error: --backend: expected one of cpu, cuda; got 'gpu'"});
  // The largest seed is a seed.
  expect_result(dsv4(gen + " --seed 18446744073709551615 --temperature 1 --ids"), 0, {});
}

TEST(Cli, ThreadsMustBeBetweenOneAndTheCores) {
  const std::string inspect = " inspect --model " + kModel;
  for (const char* bad : {"0", "-1", "1000"})
    expect_result(dsv4(std::string("--threads ") + bad + inspect), 2,
                  {std::string("error: --threads: expected an integer from 1 to "), "(this machine's cores), got '" + std::string(bad) + "'",
                   "see 'dsv4 --help'"});
  // Given after the command too (the option belongs to dsv4 itself).
  expect_result(dsv4(inspect + " --threads 1000"), 2, {"error: --threads:", "see 'dsv4 --help'"});
  expect_result(dsv4("--threads 1" + inspect), 0, {"layers: 5"});
}

TEST(Cli, TensorParallelSizeMustSplitTheModel) {
  const std::string lc = "layer-check --model " + kModel + " --golden " + kModel + "/golden.safetensors --output " +
                         test::fresh_dir("cli_tp") + "/out.safetensors";
  expect_result(dsv4("layer-check --help"), 0, {"--tensor-parallel-size INT:1 to 256=1", "--expert-parallel"});
  expect_result(dsv4(lc + " --tensor-parallel-size 0"), 2,
                {"error: --tensor-parallel-size: expected an integer from 1 to 256 (1 = not split), got '0'", "see 'dsv4 layer-check --help'"});
  // tiny-a: 4 heads, 2 output groups, 8 experts of intermediate size 256.
  expect_result(dsv4(lc + " --tensor-parallel-size 3"), 2,
                {"error: --tensor-parallel-size 3: tensor-parallel size 3 does not divide the model's 4 attention heads"});
  expect_result(dsv4(lc + " --tensor-parallel-size 4"), 2, {"does not divide the model's 2 output groups (o_groups)"});
  expect_result(dsv4(lc + " --expert-parallel"), 2, {"error: --expert-parallel splits the experts over ranks: give --tensor-parallel-size N > 1"});
  expect_result(dsv4("logits --model " + kModel + " --input x --output-dir y --tensor-parallel-size 3"), 2,
                {"does not divide the model's 4 attention heads", "see 'dsv4 logits --help'"});
  expect_result(dsv4(lc + " --tensor-parallel-size 2 --backend cuda"), 1, {"error: --backend cuda: "});
  expect_result(dsv4("serve --help"), 0, {"--tensor-parallel-size INT:1 to 256=1", "--expert-parallel"});
  expect_result(dsv4("serve --model " + kModel + " --port 0 --tensor-parallel-size 3"), 2,
                {"does not divide the model's 4 attention heads", "see 'dsv4 serve --help'"});
}

TEST(Cli, ErrorsNameTheRealProblem) {
  // A missing model directory is named as such, before anything about a tokenizer.
  expect_result(dsv4("generate --model /nonexistent/model --prompt hello"), 1, {"error: --model /nonexistent/model: no such directory"});
  const std::string dir = test::fresh_dir("cli_not_a_model");
  expect_result(dsv4("generate --model " + dir + " --prompt hello"), 1, {"config.json is missing (not a checkpoint directory)"});
  expect_result(dsv4("generate --model " + kModel + " --prompt ''"), 2, {"error: --prompt is empty: give some text (or --prompt-ids)"});
  expect_result(dsv4("generate --model " + kModel), 2, {"error: give the prompt: --prompt TEXT or --prompt-ids 1,2,3"});
  expect_result(dsv4("generate --model " + kModel + " --prompt hello"), 1,
                {"error: --prompt needs a tokenizer, and " + kModel + " has no tokenizer.json (give --prompt-ids instead)"});
  expect_result(dsv4("generate --model " + kModel + " --prompt-ids 1 --chat"), 2, {"error: --chat encodes --prompt text"});
  expect_result(dsv4("generate --model " + kModel + " --prompt hi --think"), 2, {"error: --think requires --chat"});
  expect_result(dsv4("generate --model " + kModel + " --prompt hi --system 'be brief'"), 2, {"error: --system needs --chat"});
  expect_result(dsv4("generate --model " + kModel + " --prompt-ids 1,2 --backend cuda"), 1, {"error: --backend cuda: ", "use --backend cpu"});
}

TEST(Cli, BenchOpsWithoutAGpuSaysSo) {
  const CommandResult r = dsv4("bench-ops moe");
  // This build has no CUDA backend, or a CUDA build runs where no device is visible.
  expect_result(r, 1, {"error: bench-ops runs on a GPU: "});
  EXPECT_TRUE(r.out.find("no CUDA backend") != std::string::npos || r.out.find("no CUDA device is visible") != std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(".cu:"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("CUDA error"), std::string::npos) << r.out;
  expect_result(dsv4("bench-ops everything"), 2, {"error: op: expected one of moe, moe-repack, attention, indexer, linear, persistent, chain; got 'everything'"});
}

TEST(Cli, InspectTakesModelAndKeepsThePositionalForm) {
  expect_result(dsv4("inspect --model " + kModel), 0, {"layers: 5"});
  CommandResult r = dsv4("inspect " + kModel);
  expect_result(r, 0, {"layers: 5", "note: 'dsv4 inspect DIR' is deprecated; use 'dsv4 inspect --model DIR'"});
  expect_result(dsv4("inspect"), 2, {"error: inspect needs --model DIR"});
  expect_result(dsv4("inspect --model " + kModel + " " + kModel), 2, {"error: give the checkpoint once: --model DIR"});
  expect_result(dsv4("inspect --model /nonexistent"), 1, {"error: --model /nonexistent: no such directory"});
  expect_result(dsv4("inspect --model " + kModel + " --verbose-ish"), 2, {"error: the following argument was not expected: --verbose-ish"});
  expect_result(dsv4("inspect a b"), 2, {"error: the following argument was not expected: b"});
}

TEST(Cli, MakeTinyRefusesANonEmptyDirectoryWithoutForce) {
  const std::string dir = test::fresh_dir("cli_make_tiny");
  const std::string make = "make-tiny --no-tokenizer --set vocab_size=1024 --set num_hidden_layers=2 --out " + dir;
  test::write_text(dir + "/notes.txt", "mine");
  expect_result(dsv4(make), 1, {"error: --out " + dir + " is not empty: give --force to replace the checkpoint in it"});
  EXPECT_FALSE(fs::exists(dir + "/config.json"));
  // --force replaces the checkpoint files, including a quantisation config of another format.
  test::write_text(dir + "/hf_quant_config.json", "{}");
  expect_result(dsv4(make + " --force"), 0, {"wrote "});
  EXPECT_FALSE(fs::exists(dir + "/hf_quant_config.json"));
  EXPECT_TRUE(fs::exists(dir + "/notes.txt"));
  expect_result(dsv4(make), 1, {"is not empty"});
  test::write_text(dir + "/file", "x");
  expect_result(dsv4("make-tiny --out " + dir + "/file"), 1, {"error: --out " + dir + "/file: a file is in the way"});
}

TEST(Cli, OneTokenIdSyntax) {
  const std::string gen = "generate --model " + kModel + " -n 1 --ids --prompt-ids ";
  for (const char* good : {"1,2,3", "'1, 2, 3'", "'1 2 3'", "'[1, 2, 3]'", "'1,2,3\n'"})
    expect_result(dsv4(gen + good), 0, {});
  expect_result(dsv4(gen + "1,,2"), 2, {"error: --prompt-ids: an empty item in '1,,2' (separate ids by one comma or by spaces)"});
  expect_result(dsv4(gen + ",1"), 2, {"error: --prompt-ids: an empty item in ',1'"});
  expect_result(dsv4(gen + "1,"), 2, {"error: --prompt-ids: '1,' ends with a comma"});
  expect_result(dsv4(gen + "''"), 2, {"error: --prompt-ids: no ids given"});
  expect_result(dsv4(gen + "1,x"), 2, {"error: 'x' is not a token id"});
  expect_result(dsv4(gen + "-1"), 2, {"error: '-1' is not a token id"});
  expect_result(dsv4(gen + "'[1,2'"), 2, {"error: --prompt-ids: '[' without a closing ']'"});
  // Valid syntax, but past this model's vocabulary of 1,024.
  expect_result(dsv4(gen + "1,1024"), 1, {"error: token id 1024 is outside the vocabulary (0 to 1023)"});
}

TEST(Cli, GenerateJsonIsOneResult) {
  const test::SplitResult r = test::run_dsv4_split("generate --model " + kModel + " --prompt-ids 5,6,7 -n 3 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);  // stdout holds the JSON object and nothing else
  EXPECT_EQ(j["ids"].size(), 3u);
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_EQ(j["prompt_tokens"], 3);
  EXPECT_EQ(j["completion_tokens"], 3);
  EXPECT_TRUE(j.contains("decode_tokens_per_second"));
  EXPECT_FALSE(j.contains("text"));  // no tokenizer
  EXPECT_NE(r.err.find("prefill: 3 tokens"), std::string::npos) << r.err;

  // --ids prints the same ids, comma-separated, on stdout; -n and --max-tokens are one option.
  const test::SplitResult ids = test::run_dsv4_split("generate --model " + kModel + " --prompt-ids 5,6,7 --max-tokens 3 --ids");
  ASSERT_EQ(ids.rc, 0) << ids.err;
  std::string want;
  for (const auto& id : j["ids"]) want += (want.empty() ? "" : ",") + std::to_string(id.get<int>());
  EXPECT_EQ(ids.out, want + "\n");
  EXPECT_NE(ids.err.find("stopped after 3 tokens (--max-tokens)"), std::string::npos) << ids.err;
}

TEST(Cli, GenerateStreamsAndStopsCleanlyOnCtrlC) {
  test::PtySession session("generate --model " + kModel + " --prompt-ids 5,6,7 --max-tokens 1000000 --ignore-eos --ids");
  // Streaming: ids appear while the command still runs (a million tokens would take hours).
  ASSERT_TRUE(session.wait_for("backend: cpu")) << session.output();
  const size_t start = session.size();
  ASSERT_TRUE(session.wait_for(",", start)) << session.output();
  session.interrupt();
  EXPECT_EQ(session.wait_exit(), 130) << session.output();
  EXPECT_NE(session.output().find("stopped by Ctrl-C after "), std::string::npos) << session.output();
  EXPECT_NE(session.output().find("decode: "), std::string::npos) << session.output();
}

TEST(Cli, GenerateShowsPrefillProgressOnATerminal) {
  // One token per prefill step: a progress line after each (stderr is the terminal here).
  test::PtySession session("generate --model " + kModel + " --prompt-ids 5,6,7,8 --prefill-chunk 1 -n 1 --ids");
  EXPECT_EQ(session.wait_exit(), 0) << session.output();
  EXPECT_NE(session.output().find("prefill [#######"), std::string::npos) << session.output();
  EXPECT_NE(session.output().find("3/4 tokens"), std::string::npos) << session.output();
  // Not on a file: the log stays one line per event.
  const test::SplitResult r = test::run_dsv4_split("generate --model " + kModel + " --prompt-ids 5,6,7,8 --prefill-chunk 1 -n 1 --ids");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err.find("prefill ["), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dsv4
