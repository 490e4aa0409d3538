#include "bench_serving/sweep.h"

#include <filesystem>
#include <fstream>

#include "bench_serving/svg_plot.h"
#include "core/error.h"
#include <fmt/format.h>

#include "core/log.h"

namespace dsv4::bench_serving {

namespace fs = std::filesystem;

bool gate_passes(const std::string& answer, const std::string& expect) {
  if (expect.empty()) return true;
  const size_t b = answer.find_first_not_of(" \t\r\n"), e = answer.find_last_not_of(" \t\r\n");
  if (b != std::string::npos && answer.substr(b, e - b + 1) == expect) return true;
  auto word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  for (size_t at = answer.find(expect); at != std::string::npos; at = answer.find(expect, at + 1)) {
    const bool before = at > 0 && word_char(answer[at - 1]) && word_char(expect.front());
    const bool after = at + expect.size() < answer.size() && word_char(answer[at + expect.size()]) && word_char(expect.back());
    if (!before && !after) return true;
  }
  return false;
}

namespace {

// The sweep log: each line flushed as it is written (a poller reads it while the sweep runs) and
// echoed to stderr.
class SweepLog {
 public:
  explicit SweepLog(const fs::path& path) : out_(path, std::ios::trunc), path_(path) {
    if (!out_) fail("cannot write the sweep log {}", path.string());
  }
  void line(const std::string& text) {
    out_ << text << "\n";
    out_.flush();
    log_info("{}", text);
  }
  const fs::path& path() const { return path_; }

 private:
  std::ofstream out_;
  fs::path path_;
};

// Returns "" when the gate passes, else why not.
std::string run_gate(const SweepOptions& o, SweepLog& log, const fs::path& dir) {
  HttpClient client(parse_base_url(o.serve.base_url), o.serve.http);
  SampleRequest gate;
  gate.prompt_text = o.gate.prompt;
  gate.output_len = o.gate.max_tokens;
  RequestOptions ro = o.serve.request;
  ro.endpoint = o.gate.endpoint;
  ro.ignore_eos = false;
  ro.temperature = 0.0;
  RequestOutput out = run_request(client, gate, ro);
  nlohmann::ordered_json j = {{"prompt", o.gate.prompt},   {"expect", o.gate.expect}, {"endpoint", o.gate.endpoint},
                              {"success", out.success},    {"answer", out.generated_text}, {"error", out.error},
                              {"ttft", out.ttft},          {"latency", out.latency}};
  std::ofstream(dir / "gate.json") << j.dump(2) << "\n";
  if (!out.success) return fmt::format("gate request failed: {}", out.error);
  if (!gate_passes(out.generated_text, o.gate.expect))
    return fmt::format("gate failed: asked {} {}, expected '{}', got '{}'", o.gate.endpoint, nlohmann::json(o.gate.prompt).dump(),
                       o.gate.expect, out.generated_text);
  log.line(fmt::format("gate: passed (expected '{}', answer {})", o.gate.expect, nlohmann::json(out.generated_text).dump()));
  return "";
}

std::string step_line(size_t step, size_t steps, int concurrency, const ServeBenchmarkResult& r, const std::string& file) {
  const BenchmarkMetrics& m = r.metrics;
  return fmt::format("step {}/{}: concurrency {} prompts {}: completed {} failed {} duration {:.2f} s, output {:.2f} tok/s, "
                     "total {:.2f} tok/s, median TTFT {:.2f} ms, median TPOT {:.2f} ms, median ITL {:.2f} ms -> {}",
                     step + 1, steps, concurrency, r.outputs.size(), m.completed, m.failed, r.duration_s,
                     m.output_throughput, m.total_token_throughput, m.ttft.median_ms, m.tpot.median_ms, m.itl.median_ms, file);
}

// Runs the gate and the steps; returns "" or the reason the sweep stopped.
std::string run_steps(const SweepOptions& o, SweepLog& log, const fs::path& dir, std::vector<SweepPoint>& points) {
  ServeBenchmarkOptions serve = o.serve;
  serve.label = o.label;
  wait_for_server(serve, o.ready_timeout_s);
  try {
    serve.request.model = resolve_model(serve);
  } catch (const Error& e) {
    return e.what();
  }
  log.line(fmt::format("sweep {}: {} {} model {}, concurrency {}, prompts {}", o.label, serve.base_url, serve.request.endpoint,
                       serve.request.model, fmt::join(o.concurrency, ","), fmt::join(o.num_prompts, ",")));
  if (o.gate.enabled) {
    std::string why = run_gate(o, log, dir);
    if (!why.empty()) return why;
  } else {
    log.line("gate: skipped (--no-gate)");
  }
  const bool chat = endpoint_kind(serve.request.endpoint) == EndpointKind::ChatCompletions;
  for (size_t i = 0; i < o.concurrency.size(); ++i) {
    serve.max_concurrency = o.concurrency[i];
    const auto requests = make_dataset(o.dataset, o.num_prompts[i], chat);
    ServeBenchmarkResult r = run_serve_benchmark(serve, requests);
    fmt::print("{}", format_result_block(r.metrics, {serve.max_concurrency, serve.request_rate, r.duration_s}, serve.percentile_metrics));
    std::fflush(stdout);
    const std::string file = fmt::format("c{}-n{}.json", o.concurrency[i], o.num_prompts[i]);
    save_result(r, serve, dir.string(), file);
    log.line(step_line(i, o.concurrency.size(), o.concurrency[i], r, file));
    points.push_back({o.concurrency[i], r.metrics.output_throughput, r.metrics.tpot.median_ms});
    if (r.metrics.failed > 0) return fmt::format("step {} (concurrency {}): {}", i + 1, o.concurrency[i], failure_summary(r));
  }
  return "";
}

}  // namespace

SweepOutcome run_sweep(const SweepOptions& o) {
  if (o.concurrency.empty() || o.concurrency.size() != o.num_prompts.size())
    fail("--concurrency and --num-prompts need the same number of values ({} and {})", o.concurrency.size(), o.num_prompts.size());
  for (int c : o.concurrency)
    if (c < 1) fail("--concurrency values must be at least 1");
  if (o.label.empty() || o.label.find_first_of("/ \t\n") != std::string::npos) fail("--label '{}' must be one word", o.label);
  const fs::path dir = o.result_dir.empty() ? fs::path("bench-results") / o.label : fs::path(o.result_dir);
  fs::create_directories(dir);
  SweepLog log(dir / "sweep.log");
  std::vector<SweepPoint> points;
  std::string why;
  try {
    why = run_steps(o, log, dir, points);
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (!points.empty()) {
    std::ofstream(dir / "sweep.svg") << sweep_svg(fmt::format("{}: output tok/s and median TPOT", o.label), points);
    nlohmann::ordered_json summary = nlohmann::ordered_json::array();
    for (auto& p : points)
      summary.push_back({{"concurrency", p.concurrency}, {"output_throughput", p.output_throughput}, {"median_tpot_ms", p.median_tpot_ms}});
    std::ofstream(dir / "summary.json") << summary.dump(2) << "\n";
  }
  log.line(why.empty() ? "status: ok" : "status: failed: " + why);
  log.line("ALL_DONE_" + o.label);
  return {why, log.path().string()};
}

}  // namespace dsv4::bench_serving
