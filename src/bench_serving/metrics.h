// The serving metrics of a run, defined as vLLM's calculate_metrics defines them
// (vllm/benchmarks/serve.py), printed as its "Serving Benchmark Result" block and stored under
// its JSON key names.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_serving/request.h"

namespace dsv4::bench_serving {

struct MetricSummary {
  double mean_ms = 0, median_ms = 0, std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (p, value)
};

struct BenchmarkMetrics {
  int64_t completed = 0, failed = 0;
  int64_t total_input = 0, total_output = 0;
  double request_throughput = 0, output_throughput = 0, total_token_throughput = 0;  // per second of wall time
  MetricSummary ttft, tpot, itl, e2el;
  double max_output_tokens_per_s = 0;  // busiest one-second bucket
  int64_t max_concurrent_requests = 0;
  std::vector<int64_t> output_lens;  // per request; 0 for a failed one
  bool output_counted_from_chunks = false;  // some server reported no usage
};

// Over the successful outputs: output tokens = usage.completion_tokens (the number of chunks
// with choices when a server reports no usage); TPOT = (E2EL − TTFT) / (output tokens − 1) for
// requests with more than one token; ITL = all inter-chunk gaps pooled; throughputs over
// `duration_s`, the wall time of the whole run.
BenchmarkMetrics calculate_metrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                   const std::vector<double>& percentiles);

struct RunInfo {
  std::optional<int> max_concurrency;
  double request_rate = 0;  // +inf: all at once
  double duration_s = 0;
};

// vLLM's block ("==== Serving Benchmark Result ====" ... "=====") for the selected metrics
// (a subset of ttft, tpot, itl, e2el).
std::string format_result_block(const BenchmarkMetrics& m, const RunInfo& info, const std::vector<std::string>& metrics);

// vLLM's result keys: duration, completed, failed, total_input_tokens, total_output_tokens,
// request_throughput, output_throughput, total_token_throughput, the per-request arrays
// (input_lens, output_lens, ttfts, itls, latencies, start_times, generated_texts, errors; seconds),
// max_output_tokens_per_s, max_concurrent_requests, and mean/median/std/pNN_<metric>_ms for each
// selected metric.
nlohmann::ordered_json result_json(const BenchmarkMetrics& m, const std::vector<RequestOutput>& outputs, double duration_s,
                                   const std::vector<std::string>& metrics);

// "99" for 99, "99.9" for 99.9 (Python's str of the percentile, as vLLM names its keys).
std::string percentile_word(double p);

}  // namespace dsv4::bench_serving
