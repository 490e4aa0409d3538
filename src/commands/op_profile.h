// The per-op view of `dsv4 profile`: a step's op records (backend/profiling_backend.h) summed per
// op and layer kind and per layer, printed as markdown tables or JSON, and DeepSeek-V4-Flash's
// whole step projected from the per-layer figures.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/profiling_backend.h"
#include "checkpoint/model_config.h"

namespace dsv4::commands {

using OpCost = ProfilingBackend::OpCost;

struct OpTotal {
  int calls = 0;  // per step
  double ms = 0;  // per step
  OpCost cost;
};

struct OpProfile {
  std::vector<std::pair<std::pair<std::string, std::string>, OpTotal>> ops;  // (op, layer kind), by time
  std::map<int, OpTotal> regions;  // −1 embedding, 0.. layers, n_layers head and sampling
  double step_ms = 0;              // the sum of every op's time
  OpCost step;
};

// Records of several runs of the same step → per-step means.
OpProfile summarise_ops(const std::vector<std::vector<ProfilingBackend::OpRecord>>& steps, const ModelConfig& c);
std::string region_kind(int region, const ModelConfig& c);  // embed | SWA | CSA | HCA | head

// The step of DeepSeek-V4-Flash's schedule (2 SWA + 21 CSA + 20 HCA layers, SPEC §1.2) from each
// kind's mean measured layer, plus the embedding and head as measured; `valid` when every kind
// was measured.
struct FlashProjection {
  bool valid = false;
  double swa_ms = 0, csa_ms = 0, hca_ms = 0, embed_ms = 0, head_ms = 0;
  double op_sum_ms() const;
  static constexpr int kSwa = 2, kCsa = 21, kHca = 20;
};
FlashProjection project_flash(const OpProfile& p, const ModelConfig& c);

// Markdown: the op table (µs, %, MB, GB/s, % of copy, and TFLOP/s where `flops`), the layer table.
void print_op_tables(const OpProfile& p, const ModelConfig& c, double copy_gbs, bool flops);
nlohmann::json op_tables_json(const OpProfile& p, const ModelConfig& c);

}  // namespace dsv4::commands
