#include "bench_serving/serve_benchmark.h"

#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "bench_serving/progress_bar.h"
#include "bench_serving/worker_pool.h"
#include "core/error.h"
#include "core/log.h"

namespace dsv4::bench_serving {

namespace fs = std::filesystem;

std::vector<double> arrival_offsets(size_t n, double request_rate, double burstiness, uint64_t seed) {
  std::vector<double> at(n, 0.0);
  if (!std::isfinite(request_rate) || n == 0) return at;
  if (!(request_rate > 0)) fail("--request-rate must be positive (or inf)");
  if (!(burstiness > 0)) fail("--burstiness must be positive");
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (request_rate * burstiness));
  double t = 0;
  for (size_t i = 0; i < n; ++i) at[i] = t += gap(rng);
  // vLLM rescales so the run's arrivals span exactly n / rate (a steadier throughput across seeds).
  const double scale = at.back() > 0 ? (double(n) / request_rate) / at.back() : 1.0;
  for (double& a : at) a *= scale;
  return at;
}

std::string resolve_model(const ServeBenchmarkOptions& o) {
  HttpClient client(parse_base_url(o.base_url), o.http);
  if (o.request.model.empty()) return first_served_model(client);
  HttpReply r = client.get("/v1/models");
  if (!r.error.empty())
    fail("cannot reach the server at {} (GET /v1/models: {}); is it running?", client.base().text, r.error);
  return o.request.model;
}

void wait_for_server(const ServeBenchmarkOptions& o, double timeout_s) {
  if (timeout_s <= 0) return;
  const double deadline = steady_seconds() + timeout_s;
  HttpClient client(parse_base_url(o.base_url), o.http);
  for (;;) {
    HttpReply r = client.get("/v1/models");
    if ((r.error.empty() && r.status == 200) || steady_seconds() >= deadline) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

namespace {

std::string now_stamp(const char* format) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

// Runs `indices` of `requests` through a pool, each at its arrival offset; fills outputs.
double run_requests(const ServeBenchmarkOptions& o, const BaseUrl& base, const std::vector<SampleRequest>& requests,
                    const std::vector<size_t>& indices, const std::vector<double>& arrivals, std::vector<RequestOutput>& outputs,
                    ProgressBar* bar) {
  const double start = steady_seconds();
  {
    WorkerPool pool(base, o.http, size_t(o.max_concurrency.value_or(0)), [&](size_t job, HttpClient& client) {
      outputs[job] = run_request(client, requests[indices[job]], o.request);
      if (bar) bar->add();
    });
    for (size_t job = 0; job < indices.size(); ++job) {
      const double wait = start + arrivals[job] - steady_seconds();
      if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      pool.submit(job);
    }
    pool.wait_all();
  }
  return steady_seconds() - start;
}

}  // namespace

ServeBenchmarkResult run_serve_benchmark(const ServeBenchmarkOptions& o, const std::vector<SampleRequest>& requests) {
  DSV4_CHECK(!o.request.model.empty(), "run_serve_benchmark: no model");
  DSV4_CHECK(!requests.empty(), "no requests to send (--num-prompts)");
  if (o.max_concurrency && *o.max_concurrency < 1) fail("--max-concurrency must be at least 1");
  const BaseUrl base = parse_base_url(o.base_url);
  endpoint_kind(o.request.endpoint);  // validates

  if (o.num_warmups > 0) {
    log_info("Warming up with {} requests...", o.num_warmups);
    std::vector<size_t> first(size_t(o.num_warmups), 0);
    std::vector<RequestOutput> warm(first.size());
    run_requests(o, base, requests, first, std::vector<double>(first.size(), 0.0), warm, nullptr);
    log_info("Warmup run completed.");
  }

  log_info("Starting main benchmark run...");
  log_info("Traffic request rate: {}", std::isfinite(o.request_rate) ? fmt::format("{}", o.request_rate) : "inf");
  log_info("Burstiness factor: {} ({})", o.burstiness, o.burstiness == 1.0 ? "Poisson process" : "Gamma distribution");
  log_info("Maximum request concurrency: {}", o.max_concurrency ? fmt::format("{}", *o.max_concurrency) : "None");
  ServeBenchmarkResult r;
  r.outputs.resize(requests.size());
  std::vector<size_t> all(requests.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  {
    ProgressBar bar("", int64_t(requests.size()), o.progress && log_level() >= LogLevel::Info);
    r.duration_s = run_requests(o, base, requests, all, arrival_offsets(requests.size(), o.request_rate, o.burstiness, o.seed),
                                r.outputs, &bar);
  }
  r.metrics = calculate_metrics(r.outputs, r.duration_s, o.metric_percentiles);

  nlohmann::ordered_json j;
  const bool chat = endpoint_kind(o.request.endpoint) == EndpointKind::ChatCompletions;
  j["date"] = now_stamp("%Y%m%d-%H%M%S");
  j["endpoint_type"] = chat ? "openai-chat" : "openai";
  j["backend"] = chat ? "openai-chat" : "openai";
  j["label"] = o.label.empty() ? "dsv4" : o.label;
  j["model_id"] = o.request.model;
  j["tokenizer_id"] = nullptr;
  j["base_url"] = base.text;
  j["endpoint"] = o.request.endpoint;
  j["num_prompts"] = requests.size();
  if (std::isfinite(o.request_rate)) j["request_rate"] = o.request_rate;
  else j["request_rate"] = "inf";
  j["burstiness"] = o.burstiness;
  if (o.max_concurrency) j["max_concurrency"] = *o.max_concurrency;
  else j["max_concurrency"] = nullptr;
  j["num_warmups"] = o.num_warmups;
  j["ignore_eos"] = o.request.ignore_eos;
  if (r.metrics.output_counted_from_chunks) j["output_tokens_counted_from_chunks"] = true;
  j.update(result_json(r.metrics, r.outputs, r.duration_s, o.percentile_metrics));
  r.json = std::move(j);
  return r;
}

std::string save_result(const ServeBenchmarkResult& r, const ServeBenchmarkOptions& o, const std::string& result_dir,
                        const std::string& result_filename) {
  std::string name = result_filename;
  if (name.empty()) {
    std::string model = o.request.model.substr(o.request.model.find_last_of('/') + 1);
    if (model.empty()) model = "model";
    const std::string rate = std::isfinite(o.request_rate) ? fmt::format("{}", o.request_rate) : "inf";
    name = fmt::format("{}-{}qps{}-{}-{}.json", o.label.empty() ? "dsv4" : o.label, rate,
                       o.max_concurrency ? fmt::format("-concurrency{}", *o.max_concurrency) : "", model,
                       now_stamp("%Y%m%d-%H%M%S"));
  }
  fs::path path = result_dir.empty() ? fs::path(name) : fs::path(result_dir) / name;
  if (path.has_parent_path()) fs::create_directories(path.parent_path());
  std::ofstream out(path);
  out << r.json.dump(2) << "\n";
  if (!out) fail("cannot write {}", path.string());
  return path.string();
}

std::string failure_summary(const ServeBenchmarkResult& r) {
  if (r.metrics.failed == 0) return "";
  for (const RequestOutput& o : r.outputs)
    if (!o.success)
      return fmt::format("{} of {} requests failed; first error: {}", r.metrics.failed, r.outputs.size(), o.error);
  return "";
}

}  // namespace dsv4::bench_serving
