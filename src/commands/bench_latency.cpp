// `dsv4 bench latency`: the model API (ServingModel::step: one model, or one split over ranks with
// --tensor-parallel-size) timed directly, as `vllm bench latency`
// times its engine: a batch of random prompts prefilled in one step, then greedy decode steps of
// one token per sequence, end of sequence ignored; the average and percentiles of the whole
// request latency over iterations, split into prefill and decode. Then a llama-bench-style table:
// ppN (one sequence's N-token prefill), tgN (N one-token decode steps), ppN @ dD (the prefill
// after D tokens already in the cache), each the mean ± standard deviation of tokens per second
// over repetitions.
#include "commands/bench_latency.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "bench_serving/stats.h"
#include "commands/cli_options.h"
#include "commands/golden_commands.h"
#include "core/error.h"
#include "core/log.h"
#include "model/dsv4.h"

namespace dsv4::commands {

namespace {

namespace bs = dsv4::bench_serving;

struct LatencyArgs {
  std::string model, backend = "cpu", output_json;
  int batch_size = 8;
  int64_t input_len = 32, output_len = 128;
  int warmup_iters = 10, iters = 30;
  int64_t pp = 512, tg = 128, depth = 8192, prefill_chunk = 2048;
  int repetitions = 3;
  bool no_table = false;
  uint64_t seed = 0;
  ParallelOptions parallel;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class LatencyRunner {
 public:
  LatencyRunner(ServingModel& model, uint64_t seed) : model_(model), rng_(seed) {}

  std::vector<int32_t> random_tokens(int64_t n) {
    std::uniform_int_distribution<int32_t> id(0, model_.config().vocab_size - 1);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = id(rng_);
    return t;
  }
  // A greedy-sampling item: the step reads the sampled token back, so it has finished when
  // step() returns (no logits are copied).
  static BatchItem item(SeqId seq, std::vector<int32_t> tokens, uint64_t counter) {
    BatchItem b{seq, std::move(tokens)};
    b.return_logits = false;
    b.sampling = SamplingParams{};
    b.sample_counter = counter;
    return b;
  }

  struct Iteration {
    double prefill_s = 0, decode_s = 0;
  };
  // One vllm-bench-latency iteration: batch prefill, then output_len − 1 decode steps.
  Iteration iteration(int batch, int64_t input_len, int64_t output_len) {
    std::vector<SeqId> seqs;
    std::vector<BatchItem> items;
    for (int i = 0; i < batch; ++i) {
      seqs.push_back(model_.new_sequence());
      items.push_back(item(seqs.back(), random_tokens(input_len), 0));
    }
    Iteration it;
    auto t0 = std::chrono::steady_clock::now();
    StepOutput out = model_.step(items);
    it.prefill_s = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    for (int64_t k = 1; k < output_len; ++k) {
      for (size_t i = 0; i < items.size(); ++i) items[i] = item(seqs[i], {out.tokens[i]}, uint64_t(k));
      out = model_.step(items);
    }
    it.decode_s = seconds_since(t0);
    for (SeqId s : seqs) model_.free_sequence(s);
    return it;
  }

  // Fills a fresh sequence with `depth` tokens (untimed, in chunks), then times either one
  // `prompt`-token prefill or `gen` one-token decode steps; returns tokens per second.
  double table_test(int64_t prompt, int64_t gen, int64_t depth, int64_t chunk) {
    const SeqId s = model_.new_sequence();
    for (int64_t done = 0; done < depth; done += chunk) model_.step({item(s, random_tokens(std::min(chunk, depth - done)), 0)});
    auto t0 = std::chrono::steady_clock::now();
    int64_t tokens = prompt;
    if (prompt > 0) {
      model_.step({item(s, random_tokens(prompt), 0)});
    } else {
      std::vector<int32_t> next = random_tokens(1);
      for (int64_t k = 0; k < gen; ++k) next = model_.step({item(s, next, uint64_t(k))}).tokens;
      tokens = gen;
    }
    const double secs = seconds_since(t0);
    model_.free_sequence(s);
    return double(tokens) / secs;
  }

 private:
  ServingModel& model_;
  std::mt19937_64 rng_;
};

void run_latency(const LatencyArgs& a) {
  if (a.output_len < 1 || a.input_len < 1) fail("--input-len and --output-len must be at least 1");
  check_parallel_options(a.model, a.parallel);
  std::unique_ptr<TensorParallelModel> m =
      load_parallel_model(a.model, a.backend, {a.parallel.tensor_parallel_size, a.parallel.expert_parallel});
  const std::string backend_name =
      a.parallel.tensor_parallel_size > 1
          ? fmt::format("{} × {}", a.parallel.tensor_parallel_size, m->rank_backend(0).name())
          : m->rank_backend(0).name();
  LatencyRunner runner(*m, a.seed);
  const std::string model_name = std::filesystem::path(a.model).filename().string();
  nlohmann::ordered_json result;

  if (a.iters > 0) {
    fmt::print("bench latency: {} on {}, batch {}, input {}, output {} ({} warmup + {} iterations)\n", model_name,
               backend_name, a.batch_size, a.input_len, a.output_len, a.warmup_iters, a.iters);
    for (int i = 0; i < a.warmup_iters; ++i) runner.iteration(a.batch_size, a.input_len, a.output_len);
    std::vector<double> latencies, prefills, decodes;
    for (int i = 0; i < a.iters; ++i) {
      auto it = runner.iteration(a.batch_size, a.input_len, a.output_len);
      latencies.push_back(it.prefill_s + it.decode_s);
      prefills.push_back(it.prefill_s);
      decodes.push_back(it.decode_s);
    }
    const double prefill = bs::mean(prefills), decode = bs::mean(decodes);
    const int64_t steps = a.output_len - 1;
    fmt::print("Avg latency: {:.6f} seconds\n", bs::mean(latencies));
    nlohmann::ordered_json pct;
    for (int p : {10, 25, 50, 75, 90, 99}) {
      const double v = bs::percentile(latencies, p);
      fmt::print("{}% percentile latency: {:.6f} seconds\n", p, v);
      pct[std::to_string(p)] = v;
    }
    const double prefill_tps = double(a.batch_size * a.input_len) / prefill;
    const double decode_step = steps > 0 ? decode / double(steps) : 0, decode_tps = steps > 0 ? double(a.batch_size) / decode_step : 0;
    fmt::print("prefill: {:.3f} ms for {} x {} tokens ({:.1f} tok/s)\n", prefill * 1e3, a.batch_size, a.input_len, prefill_tps);
    fmt::print("decode: {:.3f} ms per step of {} tokens over {} steps ({:.1f} tok/s)\n", decode_step * 1e3, a.batch_size, steps,
               decode_tps);
    result["avg_latency"] = bs::mean(latencies);
    result["latencies"] = latencies;
    result["percentiles"] = pct;
    result["prefill_latency"] = prefill;
    result["prefill_tokens_per_s"] = prefill_tps;
    result["decode_step_latency"] = decode_step;
    result["decode_tokens_per_s"] = decode_tps;
  }

  if (!a.no_table && a.repetitions > 0) {
    struct Test {
      std::string name;
      int64_t prompt, gen, depth;
    };
    std::vector<Test> tests;
    if (a.pp > 0) tests.push_back({fmt::format("pp{}", a.pp), a.pp, 0, 0});
    if (a.tg > 0) tests.push_back({fmt::format("tg{}", a.tg), 0, a.tg, 0});
    if (a.pp > 0 && a.depth > 0) tests.push_back({fmt::format("pp{} @ d{}", a.pp, a.depth), a.pp, 0, a.depth});
    if (!tests.empty()) runner.table_test(std::min<int64_t>(a.pp > 0 ? a.pp : 1, 32), 0, 0, a.prefill_chunk);  // warmup
    fmt::print("\n| model | backend | test | t/s |\n| --- | --- | ---: | ---: |\n");
    nlohmann::ordered_json table = nlohmann::ordered_json::array();
    for (const Test& t : tests) {
      std::vector<double> rates;
      for (int r = 0; r < a.repetitions; ++r) rates.push_back(runner.table_test(t.prompt, t.gen, t.depth, a.prefill_chunk));
      fmt::print("| {} | {} | {} | {:.2f} ± {:.2f} |\n", model_name, backend_name, t.name, bs::mean(rates), bs::stddev(rates));
      std::fflush(stdout);
      table.push_back({{"test", t.name}, {"tokens_per_s", bs::mean(rates)}, {"stddev", bs::stddev(rates)}, {"samples", rates}});
    }
    result["table"] = table;
  }
  if (!a.output_json.empty()) {
    std::ofstream out(a.output_json);
    out << result.dump(2) << "\n";
    if (!out) fail("cannot write {}", a.output_json);
  }
}

}  // namespace

void add_bench_latency_command(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("latency", "Time the engine without HTTP: prefill and decode latency, llama-bench table");
  auto a = std::make_shared<LatencyArgs>();
  cmd->add_option("--model", a->model, "Checkpoint directory or synthetic:flash[,layers=N,...]")->required();
  cmd->add_option("--backend", a->backend, "Compute backend: cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  add_parallel_options(cmd, a->parallel);
  cmd->add_option("--batch-size", a->batch_size, "Sequences per step")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  cmd->add_option("--input-len", a->input_len, "Prompt tokens per sequence")->check(CLI::Range(1, 1 << 24))->capture_default_str();
  cmd->add_option("--output-len", a->output_len, "Generated tokens per sequence")->check(CLI::Range(1, 1 << 24))->capture_default_str();
  cmd->add_option("--num-iters-warmup", a->warmup_iters, "Untimed iterations first")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--num-iters", a->iters, "Timed iterations (0: only the table)")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("-p,--n-prompt", a->pp, "Table: prefill test size (0: none)")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("-n,--n-gen", a->tg, "Table: decode test size (0: none)")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("-d,--depth", a->depth, "Table: cached tokens before the second prefill test (0: none)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("-r,--repetitions", a->repetitions, "Table: repetitions per test")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--prefill-chunk", a->prefill_chunk, "Tokens per step when filling the depth")->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--no-table", a->no_table, "Skip the table");
  cmd->add_option("--seed", a->seed, "Seed of the random prompts")->capture_default_str();
  cmd->add_option("--output-json", a->output_json, "Write the latencies and the table as JSON");
  cmd->callback([a] { run_latency(*a); });
}

}  // namespace dsv4::commands
