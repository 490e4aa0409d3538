// `dsv4 bench serve` against the scripted server (known delays): the metric arithmetic equals
// the script within 5%, failures (unreachable server, errors mid-run) give a clear message, a
// non-zero exit and the partial result, and the client sustains 256 concurrent streams without
// becoming the bottleneck (it prints the figures it measured).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "bench_serving/serve_benchmark.h"
#include "scripted_server.h"
#include "test_util.h"

extern char** environ;

namespace dsv4::bench_serving {
namespace {

namespace fs = std::filesystem;
using test::Script;
using test::ScriptedServer;

ServeBenchmarkOptions options_for(const ScriptedServer& server, const std::string& endpoint, int concurrency) {
  ServeBenchmarkOptions o;
  o.base_url = server.base_url();
  o.request.endpoint = endpoint;
  o.request.model = "scripted-model";
  o.max_concurrency = concurrency;
  o.progress = false;
  return o;
}

void expect_within(double measured, double expected, double tolerance, const char* what) {
  EXPECT_NEAR(measured, expected, std::fabs(expected) * tolerance) << what << ": measured " << measured << ", scripted " << expected;
}

TEST(BenchServe, CompletionsMetricsEqualTheScript) {
  Script script;
  script.ttft_s = 0.100;
  script.itl_s = 0.020;
  ScriptedServer server(script);
  ServeBenchmarkOptions o = options_for(server, "/v1/completions", 4);
  RandomDatasetOptions d;
  d.input_len = 32;
  d.output_len = 16;
  ServeBenchmarkResult r = run_serve_benchmark(o, random_dataset(8, d));
  const BenchmarkMetrics& m = r.metrics;
  ASSERT_EQ(m.completed, 8) << failure_summary(r);
  EXPECT_EQ(m.total_output, 8 * 16);
  EXPECT_EQ(m.total_input, 8 * 32);  // the server's usage.prompt_tokens
  const double e2el = 0.100 + 15 * 0.020;  // 0.4 s; two waves of four
  expect_within(m.ttft.mean_ms, 100, 0.05, "mean TTFT");
  expect_within(m.ttft.median_ms, 100, 0.05, "median TTFT");
  expect_within(m.tpot.mean_ms, 20, 0.05, "mean TPOT");
  expect_within(m.itl.mean_ms, 20, 0.05, "mean ITL");
  expect_within(m.itl.median_ms, 20, 0.05, "median ITL");
  expect_within(m.e2el.mean_ms, e2el * 1000, 0.05, "mean E2EL");
  expect_within(r.duration_s, 2 * e2el, 0.05, "duration");
  expect_within(m.output_throughput, 8 * 16 / (2 * e2el), 0.05, "output throughput");
  expect_within(m.total_token_throughput, 8 * (16 + 32) / (2 * e2el), 0.05, "total token throughput");
  expect_within(m.request_throughput, 8 / (2 * e2el), 0.05, "request throughput");
  EXPECT_EQ(m.max_concurrent_requests, 4);
  for (auto& out : r.outputs) {
    EXPECT_EQ(out.itl.size(), 15u);
    EXPECT_EQ(out.generated_text.size(), 16 * script.token_text.size());
  }
  std::printf("completions, 8 requests at concurrency 4: TTFT %.2f ms, TPOT %.2f ms, ITL %.2f ms, E2EL %.2f ms, %.1f tok/s "
              "(scripted 100, 20, 20, 400 ms, %.1f tok/s)\n",
              m.ttft.mean_ms, m.tpot.mean_ms, m.itl.mean_ms, m.e2el.mean_ms, m.output_throughput, 8 * 16 / (2 * e2el));
}

TEST(BenchServe, ChatMetricsWithVariedLengthsEqualTheScript) {
  Script script;
  script.ttft_s = 0.080;
  script.itl_s = 0.015;
  ScriptedServer server(script);
  ServeBenchmarkOptions o = options_for(server, "/v1/chat/completions", 3);
  o.metric_percentiles = {50, 90};
  RandomDatasetOptions d;
  d.input_len = 20;
  d.output_len = 12;
  d.range_ratio = 0.5;
  d.token_ids = false;
  ServeBenchmarkResult r = run_serve_benchmark(o, random_dataset(9, d));
  const BenchmarkMetrics& m = r.metrics;
  ASSERT_EQ(m.completed, 9) << failure_summary(r);
  double e2el_sum = 0;
  for (size_t i = 0; i < r.outputs.size(); ++i) {
    EXPECT_EQ(m.output_lens[i], r.outputs[i].output_tokens);
    e2el_sum += 0.080 + double(m.output_lens[i] - 1) * 0.015;
  }
  // The chat role chunk arrives with the first token (vLLM counts it for TTFT; one gap of ~0).
  expect_within(m.ttft.mean_ms, 80, 0.05, "mean TTFT");
  expect_within(m.tpot.mean_ms, 15, 0.05, "mean TPOT");
  expect_within(m.itl.median_ms, 15, 0.05, "median ITL");
  expect_within(m.e2el.mean_ms, e2el_sum / 9 * 1000, 0.05, "mean E2EL");
  EXPECT_EQ(r.json["endpoint_type"], "openai-chat");
  EXPECT_TRUE(r.json.contains("p90_itl_ms"));
}

TEST(BenchServe, PoissonArrivalsSpanTheRate) {
  Script script;
  script.ttft_s = 0.002;
  script.itl_s = 0.001;
  script.tokens = 2;
  ScriptedServer server(script);
  ServeBenchmarkOptions o = options_for(server, "/v1/completions", 0);
  o.max_concurrency.reset();
  o.request_rate = 25;
  RandomDatasetOptions d;
  d.input_len = 4;
  ServeBenchmarkResult r = run_serve_benchmark(o, random_dataset(50, d));
  ASSERT_EQ(r.metrics.completed, 50) << failure_summary(r);
  expect_within(r.duration_s, 50 / 25.0, 0.05, "duration of a 25 req/s run of 50");
  EXPECT_EQ(r.json["request_rate"], 25.0);
}

// Runs the dsv4 binary; returns exit status, output and the child's CPU seconds.
struct ChildRun {
  int rc = -1;
  std::string out;
  double cpu_s = 0;
};
ChildRun run_dsv4_measured(const std::vector<std::string>& args) {
  const std::string log = test::fresh_dir("bench_serve_run") + "/out.log";
  std::vector<std::string> argv = {DSV4_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  ChildRun r;
  if (posix_spawn(&pid, cargv[0], &fa, nullptr, cargv.data(), environ) != 0) return r;
  posix_spawn_file_actions_destroy(&fa);
  int status = 0;
  rusage usage{};
  wait4(pid, &status, 0, &usage);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.cpu_s = double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + 1e-6 * double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
  r.out = test::read_text(log);
  return r;
}

TEST(BenchServe, UnreachableServerIsAClearError) {
  const std::string url = "http://127.0.0.1:" + std::to_string(test::unused_port());
  ChildRun r = run_dsv4_measured({"bench", "serve", "--base-url", url, "--num-prompts", "2"});
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("error: cannot reach the server at " + url), std::string::npos) << r.out;
  // With --model given too (no model lookup needed), the reachability check still says so.
  r = run_dsv4_measured({"bench", "serve", "--base-url", url, "--model", "m", "--num-prompts", "2"});
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("cannot reach the server"), std::string::npos) << r.out;
}

void check_mid_run_failure(Script::Failure failure, const std::string& expect_error) {
  Script script;
  script.ttft_s = 0.005;
  script.itl_s = 0.002;
  script.fail_from = 5;
  script.failure = failure;
  ScriptedServer server(script);
  const std::string dir = test::fresh_dir("bench_serve_fail");
  ChildRun r = run_dsv4_measured({"bench", "serve", "--base-url", server.base_url(), "--num-prompts", "12", "--max-concurrency", "1",
                             "--random-input-len", "8", "--random-output-len", "6", "--save-result", "--result-dir", dir,
                             "--result-filename", "run.json"});
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("error: 7 of 12 requests failed; first error: " + expect_error), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Serving Benchmark Result"), std::string::npos) << r.out;
  ASSERT_TRUE(fs::exists(dir + "/run.json")) << r.out;
  auto j = nlohmann::json::parse(test::read_text(dir + "/run.json"));
  EXPECT_EQ(j["completed"], 5);
  EXPECT_EQ(j["failed"], 7);
  EXPECT_EQ(j["errors"][0], "");
  EXPECT_NE(j["errors"][5].get<std::string>().find(expect_error), std::string::npos) << j["errors"][5];
  EXPECT_EQ(j["output_lens"][4], 6);
  EXPECT_EQ(j["output_lens"][5], 0);
}

TEST(BenchServe, ServerErrorsMidRunKeepPartialResults) {
  check_mid_run_failure(Script::Failure::Http500, "HTTP 500: scripted failure");
  check_mid_run_failure(Script::Failure::ErrorEvent, "the server reported an error in the stream: scripted error event");
  check_mid_run_failure(Script::Failure::CutStream, "POST http://127.0.0.1");
}

TEST(BenchServe, Sustains256ConcurrentStreams) {
  Script script;
  script.ttft_s = 0.050;
  script.itl_s = 0.020;
  script.threads = 300;
  ScriptedServer server(script);
  const int streams = 256, prompts = 512, tokens = 64;
  const std::string dir = test::fresh_dir("bench_serve_256");
  ChildRun r = run_dsv4_measured({"bench", "serve", "--base-url", server.base_url(), "--num-prompts", std::to_string(prompts),
                             "--max-concurrency", std::to_string(streams), "--random-input-len", "16", "--random-output-len",
                             std::to_string(tokens), "--save-result", "--result-dir", dir, "--result-filename", "run.json"});
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(test::read_text(dir + "/run.json"));
  ASSERT_EQ(j["completed"], prompts);
  // The server's own account of what it sent (same steady clock): on a loaded machine the server
  // may fall behind its script; the client must keep up with what the server actually sent.
  auto served = server.served();
  ASSERT_EQ(served.size(), size_t(prompts));
  double first = 1e300, last = 0, server_e2el = 0, server_tpot = 0;
  for (auto& s : served) {
    first = std::min(first, s.arrival), last = std::max(last, s.last_sent);
    server_e2el += (s.last_sent - s.arrival) / prompts;
    server_tpot += (s.last_sent - s.first_sent) / (tokens - 1) / prompts;
  }
  const double span = last - first, server_tput = prompts * tokens / span;
  const double e2el = 0.050 + (tokens - 1) * 0.020, duration = j["duration"].get<double>();
  const double chunks = double(prompts) * (tokens + 2);  // tokens, usage, [DONE]
  const double client_added_ms = j["mean_e2el_ms"].get<double>() - server_e2el * 1000;
  std::printf("256 streams, %d requests x %d tokens (scripted: TTFT 50 ms, ITL 20 ms, %.3f s, %.0f tok/s)\n"
              "  server sent: %.3f s, %.0f tok/s, mean TPOT %.2f ms, mean E2EL %.1f ms\n"
              "  client saw:  %.3f s, %.0f tok/s, mean TPOT %.2f ms, mean E2EL %.1f ms (+%.2f ms per request), median ITL "
              "%.2f ms, p99 ITL %.2f ms, median TTFT %.2f ms, peak concurrency %d\n"
              "  client CPU:  %.2f s = %.1f us per chunk (%.0f chunks/s), %.0f%% of one core\n",
              prompts, tokens, 2 * e2el, prompts * tokens / (2 * e2el), span, server_tput, server_tpot * 1000, server_e2el * 1000,
              duration, j["output_throughput"].get<double>(), j["mean_tpot_ms"].get<double>(), j["mean_e2el_ms"].get<double>(),
              client_added_ms, j["median_itl_ms"].get<double>(), j["p99_itl_ms"].get<double>(), j["median_ttft_ms"].get<double>(),
              j["max_concurrent_requests"].get<int>(), r.cpu_s, r.cpu_s / chunks * 1e6, chunks / duration, 100 * r.cpu_s / duration);
  // Not the bottleneck: all 256 streams in flight at once, and the client's figures equal what
  // the server sent (a client that fell behind would stretch the TPOT and the duration).
  EXPECT_EQ(j["max_concurrent_requests"], streams);
  expect_within(j["mean_tpot_ms"].get<double>(), server_tpot * 1000, 0.05, "client TPOT vs the server's send gaps");
  expect_within(j["output_throughput"].get<double>(), server_tput, 0.05, "client throughput vs the server's");
  expect_within(j["mean_e2el_ms"].get<double>(), server_e2el * 1000, 0.05, "client E2EL vs the server's");
  // And the server kept close enough to its script that the run measured 256 real streams.
  expect_within(j["median_itl_ms"].get<double>(), 20, 0.25, "median ITL at 256 streams vs the script");
}

}  // namespace
}  // namespace dsv4::bench_serving
