// GET /metrics: Prometheus text exposition (format 0.0.4) under vLLM's metric names with the
// "dsv4:" prefix, so dashboards and alerts written for vLLM read this server unchanged:
//   dsv4:num_requests_running / num_requests_waiting   gauges from the engine
//   dsv4:kv_cache_usage_perc                            fraction (0..1) of the cache pages in use
//   dsv4:prompt_tokens_total / generation_tokens_total  counters from the engine
//   dsv4:time_to_first_token_seconds, dsv4:inter_token_latency_seconds (and its older name
//   dsv4:time_per_output_token_seconds), dsv4:e2e_request_latency_seconds,
//   dsv4:request_prompt_tokens, dsv4:request_generation_tokens          histograms
//   dsv4:request_success_total{finished_reason="stop|length|abort|error"}
// plus dsv4:kv_cache_pages_in_use / kv_cache_pages_capacity (absolute page counts) and
// process_resident_memory_bytes. Every dsv4: series carries model_name, as vLLM's do.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace dsv4::serve {

// A cumulative Prometheus histogram with fixed upper bounds (the +Inf bucket is implicit).
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // `name`_bucket{labels,le=...}, `name`_sum and `name`_count lines; labels is `k="v",...`.
  void render(std::string& out, const std::string& name, const std::string& labels) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative
  double sum_ = 0;
  uint64_t count_ = 0;
};

// How a request ended, in vLLM's finished_reason vocabulary.
enum class FinishedReason { Stop, Length, Abort, Error };

struct FinishedRequest {
  FinishedReason reason = FinishedReason::Stop;
  double e2e_seconds = 0;  // arrival to the last token
  int64_t prompt_tokens = 0, generation_tokens = 0;
};

class ServerMetrics {
 public:
  ServerMetrics(std::string model_name, int64_t max_model_len);

  void observe_time_to_first_token(double seconds);
  void observe_inter_token_latency(double seconds);
  void observe_finished(const FinishedRequest& request);

  // The whole exposition. Engine figures are read at the call (stats), the process's resident
  // memory is passed in (bytes; negative: unknown, the series is left out).
  std::string render(const EngineStats& stats, int64_t resident_bytes) const;

 private:
  const std::string labels_;  // model_name="..."
  mutable std::mutex mutex_;
  Histogram time_to_first_token_, inter_token_latency_, e2e_latency_, prompt_tokens_, generation_tokens_;
  std::map<FinishedReason, uint64_t> finished_;
};

}  // namespace dsv4::serve
