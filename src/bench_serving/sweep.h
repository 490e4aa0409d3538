// `dsv4 bench sweep`: the measurement workflow as one command. A correctness gate first (a
// greedy answer must contain the expected text), then one `bench serve` run per concurrency level,
// each written to its own JSON; a log with one summary line per step whose last line is always
// ALL_DONE_<label> (also after a failure, so a remote poller never waits forever; the line
// before it says "status: ok" or "status: failed: ..."); an SVG of output tok/s and median TPOT
// against concurrency.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench_serving/dataset.h"
#include "bench_serving/serve_benchmark.h"

namespace dsv4::bench_serving {

struct GateOptions {
  bool enabled = true;
  std::string prompt = "What is 17*23? Answer with the number only.";
  std::string expect = "391";
  std::string endpoint = "/v1/chat/completions";
  int64_t max_tokens = 32;
};

struct SweepOptions {
  ServeBenchmarkOptions serve;  // base URL, endpoint, model, request options shared by every step
  DatasetOptions dataset;
  GateOptions gate;
  std::vector<int> concurrency{1, 8, 16};
  std::vector<int64_t> num_prompts{8, 32, 48};
  std::string label = "dsv4";
  std::string result_dir;  // default bench-results/<label>
  double ready_timeout_s = 0;
};

// Whether a gate answer passes: its trimmed text equals `expect`, or contains it with no letter
// or digit right before or after (so "391." and "The answer is 391" pass, "3910" does not).
bool gate_passes(const std::string& answer, const std::string& expect);

struct SweepOutcome {
  std::string failure;  // empty when the gate and every step passed
  std::string log_path;
};
// Runs the sweep. Throws dsv4::Error only for invalid options (before the log exists).
SweepOutcome run_sweep(const SweepOptions& options);

}  // namespace dsv4::bench_serving
