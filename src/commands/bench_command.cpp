// `dsv4 bench serve|sweep|latency`: the serving benchmark client (bench_serving/) and the engine
// latency benchmark (bench_latency.cpp) under one command.
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <type_traits>

#include "bench_serving/serve_benchmark.h"
#include "bench_serving/sweep.h"
#include "commands/bench_latency.h"
#include "commands/commands.h"
#include "core/error.h"

namespace dsv4::commands {

namespace bs = dsv4::bench_serving;

namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ',');)
    if (!part.empty()) parts.push_back(part);
  return parts;
}

template <typename T>
std::vector<T> parse_numbers(const std::string& text, const char* option) {
  std::vector<T> values;
  for (const std::string& part : split_list(text)) {
    try {
      size_t used = 0;
      const double v = std::stod(part, &used);
      if (used != part.size() || !std::isfinite(v)) throw std::invalid_argument(part);
      if (std::is_integral_v<T> && v != std::floor(v)) throw std::invalid_argument(part);
      values.push_back(T(v));
    } catch (const std::exception&) {
      fail("{} '{}': '{}' is not a number", option, text, part);
    }
  }
  if (values.empty()) fail("{} needs at least one value", option);
  return values;
}

// Everything `serve` and `sweep` share: where to send, what to send, how to measure.
struct ClientArgs {
  bs::ServeBenchmarkOptions serve;
  bs::DatasetOptions dataset;
  std::string request_rate = "inf", temperature = "0", percentile_metrics = "ttft,tpot,itl,e2el", metric_percentiles = "99",
              extra_body, random_prompt = "ids";
  bool no_progress = false;
  double ready_timeout_s = 0;

  void finish() {
    if (serve.http.api_key.empty())
      if (const char* key = std::getenv("OPENAI_API_KEY")) serve.http.api_key = key;
    bs::endpoint_kind(serve.request.endpoint);
    serve.request_rate = request_rate == "inf" ? INFINITY : parse_numbers<double>(request_rate, "--request-rate").front();
    if (!(serve.request_rate > 0)) fail("--request-rate must be positive or inf");
    if (temperature == "server") serve.request.temperature.reset();
    else serve.request.temperature = parse_numbers<double>(temperature, "--temperature").front();
    serve.percentile_metrics = split_list(percentile_metrics);
    for (auto& m : serve.percentile_metrics)
      if (m != "ttft" && m != "tpot" && m != "itl" && m != "e2el")
        fail("--percentile-metrics: '{}' is not one of ttft, tpot, itl, e2el", m);
    serve.metric_percentiles = parse_numbers<double>(metric_percentiles, "--metric-percentiles");
    for (double p : serve.metric_percentiles)
      if (p < 0 || p > 100) fail("--metric-percentiles: {} is not in [0, 100]", p);
    if (!extra_body.empty()) {
      serve.request.extra_body = nlohmann::json::parse(extra_body, nullptr, false);
      if (!serve.request.extra_body.is_object()) fail("--extra-body must be a JSON object");
    }
    dataset.random.token_ids = random_prompt == "ids";
    dataset.random.seed = serve.seed;
    serve.progress = !no_progress;
  }
};

void add_client_options(CLI::App* cmd, ClientArgs& a) {
  cmd->add_option("--base-url", a.serve.base_url, "Server URL")->capture_default_str();
  cmd->add_option("--endpoint", a.serve.request.endpoint, "/v1/completions or /v1/chat/completions")->capture_default_str();
  cmd->add_option("--model", a.serve.request.model, "Model name to send (default: the first of /v1/models)");
  cmd->add_option("--api-key", a.serve.http.api_key, "Bearer token (default: $OPENAI_API_KEY)");
  cmd->add_option("--dataset", a.dataset.dataset, "random, or a JSON-lines file ({\"prompt\": ...} or {\"messages\": ...} per line)")
      ->capture_default_str();
  cmd->add_option("--random-input-len", a.dataset.random.input_len, "Prompt tokens of the random dataset")->capture_default_str();
  cmd->add_option("--random-output-len", a.dataset.random.output_len, "Output tokens asked for (also a file's default)")
      ->capture_default_str();
  cmd->add_option("--random-range-ratio", a.dataset.random.range_ratio,
                  "Lengths uniform in [L*(1-r), L*(1+r)], r in [0, 1) (vLLM's meaning)")->capture_default_str();
  cmd->add_option("--random-vocab-size", a.dataset.random.vocab_size, "Token ids of random prompts are below this")
      ->capture_default_str();
  cmd->add_option("--random-prompt", a.random_prompt, "Random prompts on /v1/completions as token ids or as text (chat: text)")
      ->check(CLI::IsMember({"ids", "text"}))->capture_default_str();
  cmd->add_option("--request-rate", a.request_rate, "Requests per second (Poisson arrivals), or inf: all at once")
      ->capture_default_str();
  cmd->add_option("--burstiness", a.serve.burstiness, "Gamma shape of inter-arrival times (1: Poisson)")->capture_default_str();
  cmd->add_flag("--ignore-eos", a.serve.request.ignore_eos, "Ask the server to ignore the end-of-sequence token");
  cmd->add_option("--temperature", a.temperature, "Sampling temperature sent, or 'server' to send none")->capture_default_str();
  cmd->add_option("--extra-body", a.extra_body, "JSON object merged into every request body");
  cmd->add_option("--seed", a.serve.seed, "Seed of the dataset and the arrival times")->capture_default_str();
  cmd->add_option("--percentile-metrics", a.percentile_metrics, "Metrics to report: ttft,tpot,itl,e2el")->capture_default_str();
  cmd->add_option("--metric-percentiles", a.metric_percentiles, "Percentiles to report, e.g. 25,50,99")->capture_default_str();
  cmd->add_option("--num-warmups", a.serve.num_warmups, "Warmup requests before the measured run")->capture_default_str();
  cmd->add_option("--timeout", a.serve.http.read_timeout_s, "Seconds of silence on a request before it fails")
      ->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--ready-timeout", a.ready_timeout_s, "Wait up to this many seconds for the server to answer /v1/models")
      ->capture_default_str();
  cmd->add_flag("--no-progress", a.no_progress, "No progress bar (there is none unless stderr is a terminal)");
}

void add_serve(CLI::App* bench) {
  auto* cmd = bench->add_subcommand("serve", "Benchmark an OpenAI-compatible server (vLLM's metrics and result format)");
  struct Args : ClientArgs {
    int64_t num_prompts = 1000;
    int max_concurrency = 0;
    bool save = false;
    std::string result_dir, result_filename;
  };
  auto a = std::make_shared<Args>();
  add_client_options(cmd, *a);
  cmd->add_option("--num-prompts", a->num_prompts, "Requests to send")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--max-concurrency", a->max_concurrency, "Requests in flight at most (default: no limit)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--label", a->serve.label, "Label stored in the result and its file name (default dsv4)");
  cmd->add_flag("--save-result", a->save, "Write the result JSON");
  cmd->add_option("--result-dir", a->result_dir, "Folder of the result JSON (default: the current one)");
  cmd->add_option("--result-filename", a->result_filename, "File name of the result JSON (default: vLLM's)");
  cmd->callback([a] {
    a->finish();
    if (a->max_concurrency > 0) a->serve.max_concurrency = a->max_concurrency;
    bs::wait_for_server(a->serve, a->ready_timeout_s);
    a->serve.request.model = bs::resolve_model(a->serve);
    const bool chat = bs::endpoint_kind(a->serve.request.endpoint) == bs::EndpointKind::ChatCompletions;
    const auto requests = bs::make_dataset(a->dataset, a->num_prompts, chat);
    bs::ServeBenchmarkResult r = bs::run_serve_benchmark(a->serve, requests);
    fmt::print("{}", bs::format_result_block(r.metrics, {a->serve.max_concurrency, a->serve.request_rate, r.duration_s},
                                             a->serve.percentile_metrics));
    std::fflush(stdout);
    if (a->save || !a->result_filename.empty()) {
      const std::string path = bs::save_result(r, a->serve, a->result_dir, a->result_filename);
      fmt::print(stderr, "result written to {}\n", path);
    }
    if (r.metrics.output_counted_from_chunks)
      fmt::print(stderr, "warning: the server reported no usage for some requests; their output tokens are counted as chunks\n");
    const std::string failed = bs::failure_summary(r);
    if (!failed.empty()) fail("{}", failed);
  });
}

void add_sweep(CLI::App* bench) {
  auto* cmd = bench->add_subcommand("sweep", "Correctness gate, then bench serve at several concurrencies; log, JSON and SVG");
  struct Args : ClientArgs {
    bs::SweepOptions sweep;
    std::string concurrency = "1,8,16", num_prompts = "8,32,48";
    bool no_gate = false;
  };
  auto a = std::make_shared<Args>();
  add_client_options(cmd, *a);
  cmd->add_option("--concurrency", a->concurrency, "Concurrency of each step")->capture_default_str();
  cmd->add_option("--num-prompts", a->num_prompts, "Requests of each step")->capture_default_str();
  cmd->add_option("--label", a->sweep.label, "Name of the run: the result folder and the ALL_DONE_<label> marker")
      ->capture_default_str();
  cmd->add_option("--result-dir", a->sweep.result_dir, "Where the log, JSON and SVG go (default bench-results/<label>)");
  cmd->add_option("--gate-prompt", a->sweep.gate.prompt, "The gate's question")->capture_default_str();
  cmd->add_option("--gate-expect", a->sweep.gate.expect, "Text the greedy answer must contain")->capture_default_str();
  cmd->add_option("--gate-endpoint", a->sweep.gate.endpoint, "Endpoint the gate asks")->capture_default_str();
  cmd->add_option("--gate-max-tokens", a->sweep.gate.max_tokens, "Tokens of the gate's answer at most")
      ->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_flag("--no-gate", a->no_gate, "Skip the correctness gate");
  cmd->callback([a] {
    a->finish();
    a->sweep.serve = a->serve;
    a->sweep.dataset = a->dataset;
    a->sweep.gate.enabled = !a->no_gate;
    bs::endpoint_kind(a->sweep.gate.endpoint);
    a->sweep.concurrency = parse_numbers<int>(a->concurrency, "--concurrency");
    a->sweep.num_prompts = parse_numbers<int64_t>(a->num_prompts, "--num-prompts");
    a->sweep.ready_timeout_s = a->ready_timeout_s;
    bs::SweepOutcome outcome = bs::run_sweep(a->sweep);
    if (!outcome.failure.empty()) fail("sweep {} stopped: {} (log: {})", a->sweep.label, outcome.failure, outcome.log_path);
  });
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks: serve (HTTP client), sweep (gate + concurrency sweep), latency (engine)");
  bench->require_subcommand(1);
  add_serve(bench);
  add_sweep(bench);
  add_bench_latency_command(*bench);
}

}  // namespace dsv4::commands
