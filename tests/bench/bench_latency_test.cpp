// `dsv4 bench latency` on a tiny CPU model with small sizes: the vLLM-style latency summary, the
// prefill / decode split and the llama-bench table with every test, and its JSON.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace dsv4 {
namespace {

TEST(BenchLatency, TinyModelOnCpu) {
  const std::string dir = test::fresh_dir("bench_latency");
  test::CommandResult r = test::run_dsv4("make-tiny --no-tokenizer --out " + dir + "/tiny --set vocab_size=1024 --set num_hidden_layers=3");
  ASSERT_EQ(r.rc, 0) << r.out;
  r = test::run_dsv4("bench latency --model " + dir + "/tiny --batch-size 2 --input-len 8 --output-len 4 --num-iters-warmup 1 "
                     "--num-iters 2 -p 16 -n 4 -d 32 -r 2 --prefill-chunk 16 --output-json " + dir + "/latency.json");
  ASSERT_EQ(r.rc, 0) << r.out;
  std::printf("%s", r.out.c_str());
  for (const char* text : {"Avg latency: ", "50% percentile latency: ", "99% percentile latency: ", "prefill: ",
                           "for 2 x 8 tokens", "decode: ", "per step of 2 tokens over 3 steps", "| model | backend | test | t/s |",
                           "| tiny | cpu | pp16 | ", "| tiny | cpu | tg4 | ", "| tiny | cpu | pp16 @ d32 | "})
    EXPECT_NE(r.out.find(text), std::string::npos) << text << "\n" << r.out;
  auto j = nlohmann::json::parse(test::read_text(dir + "/latency.json"));
  EXPECT_EQ(j["latencies"].size(), 2u);
  EXPECT_GT(j["avg_latency"].get<double>(), 0);
  EXPECT_GT(j["decode_tokens_per_s"].get<double>(), 0);
  ASSERT_EQ(j["table"].size(), 3u);
  EXPECT_EQ(j["table"][2]["test"], "pp16 @ d32");
  for (auto& row : j["table"]) EXPECT_GT(row["tokens_per_s"].get<double>(), 0);
}

// The same split over two ranks (tensor parallel, then expert parallel): the ranks' backends are named.
TEST(BenchLatency, SplitOverTwoRanks) {
  const std::string dir = test::fresh_dir("bench_latency_tp");
  test::CommandResult r = test::run_dsv4("make-tiny --no-tokenizer --out " + dir + "/tiny --set vocab_size=1024 --set num_hidden_layers=2");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (const std::string split : {" --tensor-parallel-size 2", " --tensor-parallel-size 2 --expert-parallel"}) {
    r = test::run_dsv4("bench latency --model " + dir + "/tiny --batch-size 2 --input-len 8 --output-len 3 --num-iters-warmup 1 "
                       "--num-iters 1 -p 8 -n 2 -d 0 -r 1" + split);
    ASSERT_EQ(r.rc, 0) << split << "\n" << r.out;
    for (const char* text : {"on 2 × cpu, batch 2", "Avg latency: ", "| tiny | 2 × cpu | tg2 | "})
      EXPECT_NE(r.out.find(text), std::string::npos) << text << "\n" << r.out;
  }
  r = test::run_dsv4("bench latency --model " + dir + "/tiny --tensor-parallel-size 3");
  EXPECT_EQ(r.rc, 2) << r.out;
}

}  // namespace
}  // namespace dsv4
