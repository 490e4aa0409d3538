// The benchmark client's pure parts: numpy-equal statistics, the SSE splitter, vLLM's metric
// arithmetic on hand-made outputs, the random dataset's length ranges, arrival times, the gate
// rule, the result block layout and the plot's well-formedness.
#include <gtest/gtest.h>

#include <cmath>

#include "bench_serving/dataset.h"
#include "bench_serving/metrics.h"
#include "bench_serving/serve_benchmark.h"
#include "bench_serving/sse_reader.h"
#include "bench_serving/stats.h"
#include "bench_serving/svg_plot.h"
#include "bench_serving/sweep.h"
#include "xml_check.h"

namespace dsv4::bench_serving {
namespace {

TEST(BenchStats, MatchNumpy) {
  // Reference values from numpy: np.percentile (linear), np.median, np.std (ddof 0).
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 99), 3.97);
  EXPECT_DOUBLE_EQ(percentile({10, 20, 30, 40, 50}, 25), 20);
  EXPECT_DOUBLE_EQ(percentile({15, 20, 35, 40, 50}, 40), 29);
  EXPECT_DOUBLE_EQ(percentile({50, 15, 40, 20, 35}, 100), 50);
  EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(stddev({2, 4, 4, 4, 5, 5, 7, 9}), 2.0);
  EXPECT_DOUBLE_EQ(mean({1, 2, 3, 4}), 2.5);
  EXPECT_EQ(mean({}), 0);
  EXPECT_EQ(percentile({}, 99), 0);
}

TEST(BenchSse, SplitsEventsAcrossArbitraryCuts) {
  const std::string stream = ": ping\n\ndata: {\"a\":1}\n\ndata: {\"b\":\r\ndata: 2}\r\n\r\nevent: x\ndata: [DONE]\n\n";
  for (size_t cut = 1; cut < stream.size(); ++cut) {
    SseReader r;
    auto first = r.feed(stream.substr(0, cut));
    auto rest = r.feed(stream.substr(cut));
    first.insert(first.end(), rest.begin(), rest.end());
    ASSERT_EQ(first.size(), 3u) << "cut at " << cut;
    EXPECT_EQ(first[0], "{\"a\":1}");
    EXPECT_EQ(first[1], "{\"b\":\n2}");
    EXPECT_EQ(first[2], "[DONE]");
  }
  SseReader r;
  EXPECT_TRUE(r.feed("data: [DONE]").empty());
  EXPECT_EQ(r.flush(), "[DONE]");
}

RequestOutput output(double start, double ttft, std::vector<double> itl, int64_t tokens, int64_t prompt) {
  RequestOutput o;
  o.success = true;
  o.start_time = start;
  o.ttft = ttft;
  o.itl = itl;
  o.latency = ttft;
  for (double g : itl) o.latency += g;
  o.output_tokens = tokens;
  o.usage_reported = true;
  o.prompt_len = prompt;
  o.content_chunks = int64_t(itl.size()) + 1;
  return o;
}

TEST(BenchMetrics, VllmArithmetic) {
  std::vector<RequestOutput> outs = {output(0.0, 0.1, {0.02, 0.02, 0.02}, 4, 10), output(0.0, 0.2, {0.04}, 2, 20),
                                     output(0.5, 0.3, {}, 1, 30)};
  RequestOutput failed;
  failed.error = "boom";
  outs.push_back(failed);
  BenchmarkMetrics m = calculate_metrics(outs, 2.0, {50, 99});
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 60);
  EXPECT_EQ(m.total_output, 7);
  EXPECT_EQ(m.output_lens, (std::vector<int64_t>{4, 2, 1, 0}));
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(m.output_throughput, 3.5);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 33.5);
  EXPECT_NEAR(m.ttft.mean_ms, 200, 1e-9);
  // TPOT only for requests with more than one token: (0.16 - 0.1) / 3 and (0.24 - 0.2) / 1.
  EXPECT_NEAR(m.tpot.mean_ms, (20 + 40) / 2.0, 1e-9);
  // ITL pools every gap: 20, 20, 20, 40.
  EXPECT_NEAR(m.itl.mean_ms, 25, 1e-9);
  EXPECT_NEAR(m.itl.median_ms, 20, 1e-9);
  EXPECT_NEAR(m.e2el.mean_ms, (160 + 240 + 300) / 3.0, 1e-9);
  ASSERT_EQ(m.itl.percentiles_ms.size(), 2u);
  EXPECT_NEAR(m.itl.percentiles_ms[1].second, percentile({20, 20, 20, 40}, 99), 1e-9);
  EXPECT_EQ(m.max_concurrent_requests, 2);
  EXPECT_EQ(m.max_output_tokens_per_s, 7);  // all tokens within the first second

  auto j = result_json(m, outs, 2.0, {"ttft", "tpot", "itl", "e2el"});
  for (const char* key : {"duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
                          "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls",
                          "generated_texts", "errors", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms",
                          "mean_tpot_ms", "p50_tpot_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["errors"][3], "boom");
  EXPECT_EQ(j["itls"][0].size(), 3u);
}

TEST(BenchMetrics, ChunksCountWhenNoUsage) {
  RequestOutput o = output(0, 0.1, {0.01, 0.01}, 0, 5);
  o.usage_reported = false;
  BenchmarkMetrics m = calculate_metrics({o}, 1.0, {99});
  EXPECT_TRUE(m.output_counted_from_chunks);
  EXPECT_EQ(m.total_output, 3);
}

TEST(BenchMetrics, ResultBlockLooksLikeVllms) {
  BenchmarkMetrics m = calculate_metrics({output(0, 0.1, {0.02}, 2, 3)}, 1.0, {99, 99.9});
  const std::string block = format_result_block(m, {8, INFINITY, 1.0}, {"ttft", "itl"});
  EXPECT_EQ(block.rfind("============ Serving Benchmark Result ============\n", 0), 0u) << block;
  EXPECT_NE(block.find("Successful requests:                     1         \n"), std::string::npos) << block;
  EXPECT_NE(block.find("Maximum request concurrency:             8"), std::string::npos) << block;
  EXPECT_EQ(block.find("Request rate configured"), std::string::npos) << block;
  EXPECT_NE(block.find("---------------Time to First Token----------------\n"), std::string::npos) << block;
  EXPECT_NE(block.find("P99.9 ITL (ms):"), std::string::npos) << block;
  EXPECT_EQ(block.find("TPOT"), std::string::npos) << block;
  EXPECT_EQ(block.substr(block.size() - 51), std::string(50, '=') + "\n");
  EXPECT_EQ(percentile_word(99), "99");
  EXPECT_EQ(percentile_word(99.9), "99.9");
}

TEST(BenchDataset, RandomLengthsFollowTheRangeRatio) {
  RandomDatasetOptions o;
  o.input_len = 100;
  o.output_len = 10;
  o.range_ratio = 0.25;
  o.vocab_size = 1000;
  auto reqs = random_dataset(2000, o);
  int64_t lo = 1 << 30, hi = 0, olo = 1 << 30, ohi = 0;
  for (auto& r : reqs) {
    ASSERT_EQ(int64_t(r.prompt_ids.size()), r.prompt_len);
    for (int32_t id : r.prompt_ids) ASSERT_TRUE(id >= 0 && id < 1000);
    lo = std::min(lo, r.prompt_len), hi = std::max(hi, r.prompt_len);
    olo = std::min(olo, r.output_len), ohi = std::max(ohi, r.output_len);
  }
  EXPECT_EQ(lo, 75);  // floor(100 · 0.75), ceil(100 · 1.25): both ends reached in 2000 draws
  EXPECT_EQ(hi, 125);
  EXPECT_EQ(olo, 7);  // floor(7.5), ceil(12.5)
  EXPECT_EQ(ohi, 13);
  o.range_ratio = 0;
  o.token_ids = false;
  auto text = random_dataset(3, o);
  for (auto& r : text) {
    EXPECT_EQ(r.prompt_len, 100);
    EXPECT_EQ(std::count(r.prompt_text.begin(), r.prompt_text.end(), ' '), 99);
  }
  o.range_ratio = 1.0;
  EXPECT_THROW(random_dataset(1, o), std::exception);
}

TEST(BenchArrivals, PoissonRescaledToTheRate) {
  auto at = arrival_offsets(1000, 10.0, 1.0, 7);
  EXPECT_NEAR(at.back(), 100.0, 1e-9);
  for (size_t i = 1; i < at.size(); ++i) ASSERT_GE(at[i], at[i - 1]);
  std::vector<double> gaps;
  for (size_t i = 1; i < at.size(); ++i) gaps.push_back(at[i] - at[i - 1]);
  EXPECT_NEAR(stddev(gaps) / mean(gaps), 1.0, 0.15);  // exponential: coefficient of variation 1
  auto all = arrival_offsets(5, INFINITY, 1.0, 7);
  EXPECT_EQ(all, std::vector<double>(5, 0.0));
}

TEST(BenchGate, AnswerRule) {
  EXPECT_TRUE(gate_passes("391", "391"));
  EXPECT_TRUE(gate_passes(" 391\n", "391"));
  EXPECT_TRUE(gate_passes("The answer is 391.", "391"));
  EXPECT_FALSE(gate_passes("3910", "391"));
  EXPECT_FALSE(gate_passes("392", "391"));
  EXPECT_FALSE(gate_passes("", "391"));
  EXPECT_TRUE(gate_passes("anything", ""));
}

TEST(BenchPlot, SvgIsWellFormed) {
  std::vector<SweepPoint> pts = {{1, 41.5, 22.1}, {8, 250.25, 28.0}, {16, 402.0, 35.5}};
  const std::string svg = sweep_svg("a<b & \"c\"", pts);
  test::XmlElement root = test::XmlParser(svg).parse();
  EXPECT_EQ(root.name, "svg");
  std::vector<const test::XmlElement*> lines, circles;
  root.find_all("polyline", lines);
  root.find_all("circle", circles);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(circles.size(), 6u);
  EXPECT_THROW(test::XmlParser("<svg><g></svg>").parse(), std::runtime_error);
  EXPECT_THROW(test::XmlParser("<svg a=1/>").parse(), std::runtime_error);
  EXPECT_EQ(nice_step(402, 5), 100);
  EXPECT_EQ(nice_step(35.5, 5), 10);
}

}  // namespace
}  // namespace dsv4::bench_serving
