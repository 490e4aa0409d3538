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
// The same from any per-region times (ms).
FlashProjection project_flash(const std::map<int, double>& region_ms, const ModelConfig& c);
// The bytes (weights + cache) of that step: each kind's mean measured layer times its count, plus the
// embedding and head as measured; 0 unless every kind was measured. Over a projected step time, the
// whole model's share of the copy bandwidth, which the measured few layers overstate: their head is a
// larger part of their bytes, and it streams near the copy bandwidth.
double flash_step_bytes(const OpProfile& p, const ModelConfig& c);

// A traced replay of the recorded step (Backend::trace_replays) seen by op: each item's share of
// the replayed step is how far it moved the step's end — items in order of their ends, each
// counted from the latest end before it (or the step's first start) — so that work overlapped by
// a programmatic launch or a branch counts once, and the shares add up to the replayed step.
struct ReplayView {
  bool traced = false;
  std::string why_not;  // when not traced
  int replays = 0;
  double step_us = 0;  // mean traced step: first start to last end
  std::map<std::pair<std::string, std::string>, double> op_us;  // (op, layer kind) → µs per step
  std::map<std::pair<std::string, int>, double> op_region_us;     // (op, region) → µs per step
  std::map<int, double> region_us;
  struct Kernel {
    std::string name;
    int calls = 0;               // per step
    double us = 0, busy_us = 0;  // share of the step; start to end, summed (a programmatic launch
                                 // starts early and waits, so busy exceeds the share)
  };
  std::vector<Kernel> kernels;  // by share
  double unattributed_us = 0;   // items no op call made
};
ReplayView replay_view(const std::vector<std::vector<CapturedWork::TracedItem>>& replays,
                       const std::vector<ProfilingBackend::RecordedOp>& ops, const ModelConfig& c);
void print_replay_kernels(const ReplayView& v, int top);

// A region's replayed time split between the ops that stream weights (at least kStreamingOpBytes of
// weights a call: the projections, the experts, the head) and the rest: the latency-bound stretches
// (mixes, norms, RoPE, attention, the router, the indexer) during which HBM mostly idles. With the
// region's bytes (weights + cache), the bound of a form that read the next weights during the
// stretches (a resident layer): max(stretches, bytes at the copy bandwidth).
struct RegionSplit {
  double streaming_us = 0, stretch_us = 0, bytes = 0;
  double overlapped_us(double copy_gbs) const;
};
constexpr double kStreamingOpBytes = 4e6;
std::map<int, RegionSplit> split_regions(const OpProfile& p, const ReplayView& v, const ModelConfig& c);
// The 43-layer step from each kind's mean overlapped bound (embedding and head as split).
FlashProjection project_flash_overlapped(const std::map<int, RegionSplit>& split, double copy_gbs, const ModelConfig& c);
// The 43-layer step from the traced replay's layer shares: what the replay spends per layer kind,
// with no replayed / op-sum ratio to assume.
FlashProjection project_flash(const ReplayView& v, const ModelConfig& c);
// One traced replay as Chrome trace events ("X" events, µs): an item per event, named by its kernel,
// with its op and layer as arguments; items that overlap go to separate rows.
void write_chrome_trace(const std::string& path, const std::vector<CapturedWork::TracedItem>& replay,
                        const std::vector<ProfilingBackend::RecordedOp>& ops, const ModelConfig& c);
nlohmann::json replay_view_json(const ReplayView& v);

// Markdown: the op table (µs, %, MB, GB/s, % of copy, and TFLOP/s where `flops`), the layer table.
// With a traced replay, each row also has its µs in the replayed step, and each layer its split.
void print_op_tables(const OpProfile& p, const ModelConfig& c, double copy_gbs, bool flops, const ReplayView* replay = nullptr);
nlohmann::json op_tables_json(const OpProfile& p, const ModelConfig& c, const ReplayView* replay = nullptr);

}  // namespace dsv4::commands
