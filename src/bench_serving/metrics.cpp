#include "bench_serving/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "bench_serving/stats.h"

namespace dsv4::bench_serving {

namespace {

MetricSummary summarize(const std::vector<double>& seconds, const std::vector<double>& percentiles) {
  MetricSummary s;
  s.mean_ms = mean(seconds) * 1000;
  s.median_ms = median(seconds) * 1000;
  s.std_ms = stddev(seconds) * 1000;
  for (double p : percentiles) s.percentiles_ms.emplace_back(p, percentile(seconds, p) * 1000);
  return s;
}

// vLLM's peak figures: output tokens per one-second bucket from each request's token times
// (start + ttft + running sum of ITLs), and the peak number of requests in flight (half-open
// intervals [start, start + latency)).
void peaks(const std::vector<RequestOutput>& outputs, BenchmarkMetrics& m) {
  double first = INFINITY, last = -INFINITY;
  for (auto& o : outputs)
    if (o.success) first = std::min(first, o.start_time), last = std::max(last, o.start_time + o.latency);
  if (!(first <= last)) return;
  std::vector<double> buckets(size_t(std::ceil(last - first)) + 1, 0.0);
  std::vector<std::pair<double, int>> events;
  for (auto& o : outputs) {
    if (!o.success) continue;
    double t = o.start_time + o.ttft;
    auto add = [&](double at) {
      const auto b = int64_t(at - first);
      if (b >= 0 && size_t(b) < buckets.size()) buckets[size_t(b)] += 1;
    };
    add(t);
    for (double gap : o.itl) add(t += gap);
    events.emplace_back(o.start_time, 1);
    events.emplace_back(o.start_time + o.latency, -1);
  }
  std::sort(events.begin(), events.end());  // at equal times −1 sorts before +1
  int64_t now = 0;
  for (auto& e : events) m.max_concurrent_requests = std::max(m.max_concurrent_requests, now += e.second);
  m.max_output_tokens_per_s = *std::max_element(buckets.begin(), buckets.end());
}

}  // namespace

BenchmarkMetrics calculate_metrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                   const std::vector<double>& percentiles) {
  BenchmarkMetrics m;
  std::vector<double> ttfts, tpots, itls, e2els;
  for (const RequestOutput& o : outputs) {
    if (!o.success) {
      ++m.failed;
      m.output_lens.push_back(0);
      continue;
    }
    int64_t output_len = o.output_tokens;
    if (!o.usage_reported) {
      output_len = o.content_chunks;
      m.output_counted_from_chunks = true;
    }
    m.output_lens.push_back(output_len);
    m.total_input += o.prompt_len;
    if (output_len > 1) tpots.push_back((o.latency - o.ttft) / double(output_len - 1));
    itls.insert(itls.end(), o.itl.begin(), o.itl.end());
    ttfts.push_back(o.ttft);
    e2els.push_back(o.latency);
    ++m.completed;
  }
  for (int64_t n : m.output_lens) m.total_output += n;
  const double d = duration_s > 0 ? duration_s : 1e-9;
  m.request_throughput = double(m.completed) / d;
  m.output_throughput = double(m.total_output) / d;
  m.total_token_throughput = double(m.total_input + m.total_output) / d;
  m.ttft = summarize(ttfts, percentiles);
  m.tpot = summarize(tpots, percentiles);
  m.itl = summarize(itls, percentiles);
  m.e2el = summarize(e2els, percentiles);
  peaks(outputs, m);
  return m;
}

std::string percentile_word(double p) {
  if (p == std::floor(p)) return fmt::format("{}", int64_t(p));
  return fmt::format("{}", p);
}

namespace {

struct MetricName {
  const char* key;
  const char* label;
  const char* header;
  const MetricSummary BenchmarkMetrics::*summary;
};
constexpr MetricName kMetrics[] = {
    {"ttft", "TTFT", "Time to First Token", &BenchmarkMetrics::ttft},
    {"tpot", "TPOT", "Time per Output Token (excl. 1st token)", &BenchmarkMetrics::tpot},
    {"itl", "ITL", "Inter-token Latency", &BenchmarkMetrics::itl},
    {"e2el", "E2EL", "End-to-end Latency", &BenchmarkMetrics::e2el},
};
bool selected(const std::vector<std::string>& metrics, const char* key) {
  return std::find(metrics.begin(), metrics.end(), key) != metrics.end();
}
// Python's "{s:{c}^{n}}": centred, the extra fill on the right.
std::string centered(const std::string& s, char fill, size_t width) {
  if (s.size() >= width) return s;
  const size_t left = (width - s.size()) / 2;
  return std::string(left, fill) + s + std::string(width - s.size() - left, fill);
}

}  // namespace

std::string format_result_block(const BenchmarkMetrics& m, const RunInfo& info, const std::vector<std::string>& metrics) {
  std::string s;
  auto line = [&](const std::string& name, const std::string& value) { s += fmt::format("{:<40} {:<10}\n", name, value); };
  auto real = [](double v) { return fmt::format("{:.2f}", v); };
  s += centered(" Serving Benchmark Result ", '=', 50) + "\n";
  line("Successful requests:", fmt::format("{}", m.completed));
  line("Failed requests:", fmt::format("{}", m.failed));
  if (info.max_concurrency) line("Maximum request concurrency:", fmt::format("{}", *info.max_concurrency));
  if (std::isfinite(info.request_rate)) line("Request rate configured (RPS):", real(info.request_rate));
  line("Benchmark duration (s):", real(info.duration_s));
  line("Total input tokens:", fmt::format("{}", m.total_input));
  line("Total generated tokens:", fmt::format("{}", m.total_output));
  line("Request throughput (req/s):", real(m.request_throughput));
  line("Output token throughput (tok/s):", real(m.output_throughput));
  line("Peak output token throughput (tok/s):", real(m.max_output_tokens_per_s));
  line("Peak concurrent requests:", real(double(m.max_concurrent_requests)));
  line("Total token throughput (tok/s):", real(m.total_token_throughput));
  for (const MetricName& mn : kMetrics) {
    if (!selected(metrics, mn.key)) continue;
    const MetricSummary& v = m.*mn.summary;
    s += centered(mn.header, '-', 50) + "\n";
    line(fmt::format("Mean {} (ms):", mn.label), real(v.mean_ms));
    line(fmt::format("Median {} (ms):", mn.label), real(v.median_ms));
    for (auto& [p, value] : v.percentiles_ms) line(fmt::format("P{} {} (ms):", percentile_word(p), mn.label), real(value));
  }
  s += std::string(50, '=') + "\n";
  return s;
}

nlohmann::ordered_json result_json(const BenchmarkMetrics& m, const std::vector<RequestOutput>& outputs, double duration_s,
                                   const std::vector<std::string>& metrics) {
  nlohmann::ordered_json r;
  r["duration"] = duration_s;
  r["completed"] = m.completed;
  r["failed"] = m.failed;
  r["total_input_tokens"] = m.total_input;
  r["total_output_tokens"] = m.total_output;
  r["request_throughput"] = m.request_throughput;
  r["request_goodput"] = nullptr;
  r["output_throughput"] = m.output_throughput;
  r["total_token_throughput"] = m.total_token_throughput;
  auto per_request = [&](auto field) {
    auto a = nlohmann::ordered_json::array();
    for (const RequestOutput& o : outputs) a.push_back(field(o));
    return a;
  };
  r["input_lens"] = per_request([](const RequestOutput& o) { return o.prompt_len; });
  r["output_lens"] = m.output_lens;
  r["ttfts"] = per_request([](const RequestOutput& o) { return o.ttft; });
  r["itls"] = per_request([](const RequestOutput& o) { return o.itl; });
  r["latencies"] = per_request([](const RequestOutput& o) { return o.latency; });
  const double t0 = outputs.empty() ? 0 : std::min_element(outputs.begin(), outputs.end(), [](auto& a, auto& b) {
                                             return a.start_time < b.start_time;
                                           })->start_time;
  r["start_times"] = per_request([&](const RequestOutput& o) { return o.start_time - t0; });
  r["generated_texts"] = per_request([](const RequestOutput& o) { return o.generated_text; });
  r["errors"] = per_request([](const RequestOutput& o) { return o.error; });
  r["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  r["max_concurrent_requests"] = m.max_concurrent_requests;
  for (const MetricName& mn : kMetrics) {
    if (!selected(metrics, mn.key)) continue;
    const MetricSummary& v = m.*mn.summary;
    r[fmt::format("mean_{}_ms", mn.key)] = v.mean_ms;
    r[fmt::format("median_{}_ms", mn.key)] = v.median_ms;
    r[fmt::format("std_{}_ms", mn.key)] = v.std_ms;
    for (auto& [p, value] : v.percentiles_ms) r[fmt::format("p{}_{}_ms", percentile_word(p), mn.key)] = value;
  }
  return r;
}

}  // namespace dsv4::bench_serving
