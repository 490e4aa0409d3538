// `dsv4 bench sweep` against the scripted server: the gate, three steps with vLLM's JSON keys, the
// log ending in ALL_DONE_<label>, a well-formed SVG; a failing gate and an unreachable server stop
// it with a clear message, a non-zero exit and the marker still written.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "scripted_server.h"
#include "test_util.h"
#include "xml_check.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;
using test::Script;
using test::ScriptedServer;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream ss(text);
  for (std::string l; std::getline(ss, l);) lines.push_back(l);
  return lines;
}

// The keys `vllm bench serve --save-result` writes that the sweep's consumers read.
const char* kVllmKeys[] = {"date", "endpoint_type", "label", "model_id", "num_prompts", "request_rate", "burstiness",
                           "max_concurrency", "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                           "request_throughput", "output_throughput", "total_token_throughput", "input_lens", "output_lens",
                           "ttfts", "itls", "generated_texts", "errors", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms",
                           "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
                           "median_itl_ms", "std_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms", "std_e2el_ms",
                           "p99_e2el_ms"};

TEST(BenchSweep, GateThreeStepsLogJsonAndSvg) {
  Script script;
  script.ttft_s = 0.004;
  script.itl_s = 0.002;
  ScriptedServer server(script);
  const std::string dir = test::fresh_dir("bench_sweep_ok");
  test::CommandResult r = test::run_dsv4("bench sweep --base-url " + server.base_url() + " --label smoke --result-dir " + dir +
                                         " --random-input-len 16 --random-output-len 8");
  ASSERT_EQ(r.rc, 0) << r.out;
  auto log = lines_of(test::read_text(dir + "/sweep.log"));
  ASSERT_GE(log.size(), 6u) << r.out;
  EXPECT_EQ(log.back(), "ALL_DONE_smoke");
  EXPECT_EQ(log[log.size() - 2], "status: ok");
  EXPECT_EQ(log[1].rfind("gate: passed (expected '391', answer \"391\")", 0), 0u) << log[1];
  const int concurrency[] = {1, 8, 16}, prompts[] = {8, 32, 48};
  for (int i = 0; i < 3; ++i) {
    const std::string file = "c" + std::to_string(concurrency[i]) + "-n" + std::to_string(prompts[i]) + ".json";
    EXPECT_EQ(log[size_t(2 + i)].rfind("step " + std::to_string(i + 1) + "/3: concurrency " + std::to_string(concurrency[i]) +
                                          " prompts " + std::to_string(prompts[i]) + ": completed " + std::to_string(prompts[i]) +
                                          " failed 0",
                                      0),
              0u)
        << log[size_t(2 + i)];
    EXPECT_NE(log[size_t(2 + i)].find("-> " + file), std::string::npos);
    auto j = nlohmann::json::parse(test::read_text(dir + "/" + file));
    for (const char* key : kVllmKeys) EXPECT_TRUE(j.contains(key)) << file << ": " << key;
    EXPECT_EQ(j["max_concurrency"], concurrency[i]);
    EXPECT_EQ(j["completed"], prompts[i]);
    EXPECT_EQ(j["total_output_tokens"], prompts[i] * 8);
    EXPECT_EQ(j["label"], "smoke");
    EXPECT_EQ(j["request_rate"], "inf");
  }
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n') > 0, true);
  EXPECT_NE(r.out.find("Serving Benchmark Result"), std::string::npos);

  test::XmlElement svg = test::XmlParser(test::read_text(dir + "/sweep.svg")).parse();
  EXPECT_EQ(svg.name, "svg");
  EXPECT_EQ(svg.attributes.at("xmlns"), "http://www.w3.org/2000/svg");
  std::vector<const test::XmlElement*> polylines;
  svg.find_all("polyline", polylines);
  ASSERT_EQ(polylines.size(), 2u);
  for (auto* p : polylines) {
    std::stringstream pts(p->attributes.at("points"));
    int n = 0;
    for (std::string xy; pts >> xy; ++n) EXPECT_NE(xy.find(','), std::string::npos);
    EXPECT_EQ(n, 3);
  }
  auto summary = nlohmann::json::parse(test::read_text(dir + "/summary.json"));
  ASSERT_EQ(summary.size(), 3u);
  EXPECT_EQ(summary[2]["concurrency"], 16);
}

TEST(BenchSweep, FailingGateStopsWithTheMarker) {
  Script script;
  script.ttft_s = 0.002;
  script.itl_s = 0.001;
  script.gate_answer = "392";
  ScriptedServer server(script);
  const std::string dir = test::fresh_dir("bench_sweep_gate");
  test::CommandResult r = test::run_dsv4("bench sweep --base-url " + server.base_url() + " --label gate --result-dir " + dir);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("error: sweep gate stopped: gate failed: asked /v1/chat/completions \"What is 17*23? Answer with the "
                       "number only.\", expected '391', got '392'"),
            std::string::npos)
      << r.out;
  auto log = lines_of(test::read_text(dir + "/sweep.log"));
  ASSERT_GE(log.size(), 2u);
  EXPECT_EQ(log.back(), "ALL_DONE_gate");
  EXPECT_EQ(log[log.size() - 2].rfind("status: failed: gate failed", 0), 0u) << log[log.size() - 2];
  EXPECT_FALSE(fs::exists(dir + "/c1-n8.json"));
  EXPECT_EQ(server.requests(), 1);  // only the gate was asked
  // --no-gate skips it; one small step.
  r = test::run_dsv4("bench sweep --no-gate --base-url " + server.base_url() + " --label nogate --result-dir " + dir +
                     "/nogate --concurrency 2 --num-prompts 2 --random-output-len 2");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(test::read_text(dir + "/nogate/sweep.log").find("gate: skipped"), std::string::npos);
}

TEST(BenchSweep, UnreachableServerAndMidRunErrorsStopWithTheMarker) {
  const std::string dir = test::fresh_dir("bench_sweep_down");
  const std::string url = "http://127.0.0.1:" + std::to_string(test::unused_port());
  test::CommandResult r = test::run_dsv4("bench sweep --base-url " + url + " --label down --result-dir " + dir);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("cannot reach the server at " + url), std::string::npos) << r.out;
  auto log = lines_of(test::read_text(dir + "/sweep.log"));
  ASSERT_GE(log.size(), 2u);
  EXPECT_EQ(log.back(), "ALL_DONE_down");

  Script script;
  script.ttft_s = 0.002;
  script.itl_s = 0.001;
  script.fail_from = 1 + 8 + 10;  // the gate, step 1, then 10 requests of step 2
  ScriptedServer server(script);
  r = test::run_dsv4("bench sweep --base-url " + server.base_url() + " --label mid --result-dir " + dir + "/mid --random-output-len 4");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("step 2 (concurrency 8): 22 of 32 requests failed; first error: HTTP 500"), std::string::npos) << r.out;
  log = lines_of(test::read_text(dir + "/mid/sweep.log"));
  EXPECT_EQ(log.back(), "ALL_DONE_mid");
  EXPECT_TRUE(fs::exists(dir + "/mid/c1-n8.json"));
  EXPECT_TRUE(fs::exists(dir + "/mid/c8-n32.json"));  // the failing step's partial result
  EXPECT_FALSE(fs::exists(dir + "/mid/c16-n48.json"));
  EXPECT_TRUE(fs::exists(dir + "/mid/sweep.svg"));
}

}  // namespace
}  // namespace dsv4
