#include "serve/http/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace dsv4::serve {
namespace {

// vLLM's bucket bounds for the same series, so histogram queries carry over.
const std::vector<double> kTimeToFirstTokenBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                                      1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kInterTokenBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                                0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kE2eBuckets = {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0,  15.0,  20.0,
                                         30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

// 1, 2, 5, 10, 20, 50, ... up to the model length (vLLM's build_1_2_5_buckets).
std::vector<double> one_two_five_buckets(int64_t max_value) {
  std::vector<double> bounds;
  for (double decade = 1;; decade *= 10)
    for (double m : {1.0, 2.0, 5.0}) {
      if (m * decade > double(std::max<int64_t>(max_value, 1))) return bounds;
      bounds.push_back(m * decade);
    }
}

// Prometheus label values escape backslash, double quote and newline.
std::string escape_label(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

const char* reason_label(FinishedReason r) {
  switch (r) {
    case FinishedReason::Stop: return "stop";
    case FinishedReason::Length: return "length";
    case FinishedReason::Abort: return "abort";
    case FinishedReason::Error: return "error";
  }
  return "error";
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t bucket = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? number(bounds_[i]) : "+Inf";
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, le, cumulative);
  }
  out += fmt::format("{}_sum{{{}}} {}\n", name, labels, number(sum_));
  out += fmt::format("{}_count{{{}}} {}\n", name, labels, count_);
}

ServerMetrics::ServerMetrics(std::string model_name, int64_t max_model_len)
    : labels_(fmt::format("model_name=\"{}\"", escape_label(model_name))),
      time_to_first_token_(kTimeToFirstTokenBuckets),
      inter_token_latency_(kInterTokenBuckets),
      e2e_latency_(kE2eBuckets),
      prompt_tokens_(one_two_five_buckets(max_model_len)),
      generation_tokens_(one_two_five_buckets(max_model_len)) {
  for (FinishedReason r : {FinishedReason::Stop, FinishedReason::Length, FinishedReason::Abort, FinishedReason::Error})
    finished_[r] = 0;  // every label value is exported from the start, so rate() sees the first one
}

void ServerMetrics::observe_time_to_first_token(double seconds) {
  std::lock_guard lock(mutex_);
  time_to_first_token_.observe(seconds);
}

void ServerMetrics::observe_inter_token_latency(double seconds) {
  std::lock_guard lock(mutex_);
  inter_token_latency_.observe(seconds);
}

void ServerMetrics::observe_finished(const FinishedRequest& request) {
  std::lock_guard lock(mutex_);
  ++finished_[request.reason];
  e2e_latency_.observe(request.e2e_seconds);
  prompt_tokens_.observe(double(request.prompt_tokens));
  generation_tokens_.observe(double(request.generation_tokens));
}

std::string ServerMetrics::render(const EngineStats& stats, int64_t resident_bytes) const {
  std::string out;
  auto gauge = [&](const char* name, const char* help, double value) {
    header(out, name, "gauge", help);
    out += fmt::format("{}{{{}}} {}\n", name, labels_, number(value));
  };
  auto counter = [&](const char* name, const char* help, double value) {
    header(out, name, "counter", help);
    out += fmt::format("{}{{{}}} {}\n", name, labels_, number(value));
  };
  gauge("dsv4:num_requests_running", "Number of requests in model execution batches.", double(stats.running));
  gauge("dsv4:num_requests_waiting", "Number of requests waiting to be processed.", double(stats.waiting));
  const double usage = stats.cache_pages_capacity > 0 ? double(stats.cache_pages_in_use) / double(stats.cache_pages_capacity) : 0.0;
  gauge("dsv4:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage);
  gauge("dsv4:kv_cache_pages_in_use", "KV-cache and indexer-key pages in use, all layers.", double(stats.cache_pages_in_use));
  gauge("dsv4:kv_cache_pages_capacity", "KV-cache and indexer-key pages available, all layers (0: unbounded).",
        double(stats.cache_pages_capacity));
  counter("dsv4:prompt_tokens_total", "Number of prefill tokens processed.", double(stats.prompt_tokens));
  counter("dsv4:generation_tokens_total", "Number of generation tokens processed.", double(stats.generation_tokens));

  std::lock_guard lock(mutex_);
  header(out, "dsv4:request_success_total", "counter", "Count of successfully processed requests.");
  for (const auto& [reason, count] : finished_)
    out += fmt::format("dsv4:request_success_total{{{},finished_reason=\"{}\"}} {}\n", labels_, reason_label(reason), count);
  auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    header(out, name, "histogram", help);
    h.render(out, name, labels_);
  };
  histogram("dsv4:time_to_first_token_seconds", "Histogram of time to first token in seconds.", time_to_first_token_);
  histogram("dsv4:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", inter_token_latency_);
  histogram("dsv4:time_per_output_token_seconds", "Histogram of time per output token in seconds (same as inter_token_latency).",
            inter_token_latency_);
  histogram("dsv4:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", e2e_latency_);
  histogram("dsv4:request_prompt_tokens", "Number of prefill tokens processed per request.", prompt_tokens_);
  histogram("dsv4:request_generation_tokens", "Number of generation tokens processed per request.", generation_tokens_);
  if (resident_bytes >= 0) {
    header(out, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
    out += fmt::format("process_resident_memory_bytes {}\n", resident_bytes);
  }
  return out;
}

}  // namespace dsv4::serve
