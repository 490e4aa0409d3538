// `dsv4 bench serve`: a run of requests against an OpenAI-compatible server, scheduled as vLLM's
// `vllm bench serve` schedules them (all at once, or arrivals of a Poisson / gamma process at
// --request-rate; at most --max-concurrency in flight), measured per request (request.h) and
// summarised with vLLM's metric definitions (metrics.h).
#pragma once
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_serving/dataset.h"
#include "bench_serving/http_client.h"
#include "bench_serving/metrics.h"
#include "bench_serving/request.h"

namespace dsv4::bench_serving {

struct ServeBenchmarkOptions {
  std::string base_url = "http://127.0.0.1:8000";
  RequestOptions request;  // endpoint, model (empty: the first of /v1/models), ignore_eos, ...
  HttpOptions http;
  std::optional<int> max_concurrency;
  double request_rate = INFINITY;  // requests per second; inf: all at once
  double burstiness = 1.0;         // gamma shape of the inter-arrival times (1: Poisson)
  uint64_t seed = 0;
  int num_warmups = 0;
  std::vector<std::string> percentile_metrics{"ttft", "tpot", "itl", "e2el"};
  std::vector<double> metric_percentiles{99};
  bool progress = true;  // a progress bar when stderr is a terminal
  std::string label;     // stored in the result ("dsv4" when empty)
};

struct ServeBenchmarkResult {
  std::vector<RequestOutput> outputs;  // in request order
  BenchmarkMetrics metrics;
  double duration_s = 0;
  nlohmann::ordered_json json;  // run metadata (date, endpoint, model, settings), then result_json
};

// Arrival offsets in seconds from the start (vLLM's get_request: gamma(burstiness,
// 1 / (rate · burstiness)) gaps, cumulated and rescaled so the last is n / rate; all 0 for inf).
std::vector<double> arrival_offsets(size_t n, double request_rate, double burstiness, uint64_t seed);

// Checks that the server answers (GET /v1/models) and returns the model to ask for: `model` if
// given, else the first one listed. Throws dsv4::Error with a clear message otherwise.
std::string resolve_model(const ServeBenchmarkOptions& options);

// Polls GET /v1/models every 0.5 s until it answers 200 or timeout_s has passed (0: no wait).
void wait_for_server(const ServeBenchmarkOptions& options, double timeout_s);

// Runs warmups and the requests; options.request.model must be set. Never throws for request
// failures: they are in the outputs and metrics.
ServeBenchmarkResult run_serve_benchmark(const ServeBenchmarkOptions& options, const std::vector<SampleRequest>& requests);

// Writes the result JSON; returns the path. An empty filename gives vLLM's
// "<label>-<rate>qps[-concurrency<C>]-<model>-<YYYYmmdd-HHMMSS>.json".
std::string save_result(const ServeBenchmarkResult& result, const ServeBenchmarkOptions& options,
                        const std::string& result_dir, const std::string& result_filename);

// "N of M requests failed; first error: ..." (empty when none failed).
std::string failure_summary(const ServeBenchmarkResult& result);

}  // namespace dsv4::bench_serving
