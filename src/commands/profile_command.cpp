// `dsv4 profile`: what one decode step costs on a model — the eager step (host plan, enqueue,
// read-back), the same step replayed from its recording, the host's share, and the bytes a step
// must read against the copy bandwidth measured in the same run. Markdown on stdout, or --json.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "backend/kv_cache_layout.h"
#include "commands/commands.h"
#include "commands/golden_commands.h"
#include "core/error.h"
#include "core/log.h"

namespace dsv4::commands {

namespace {

using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point t0) { return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count(); }

struct ProfileArgs {
  std::string model, backend = "cuda";
  int batch = 1, context = 4096, steps = 20;
  bool json = false;
};

// Device copy bandwidth through the backend (bytes read + written per second), best of a few.
double copy_bandwidth_gbs(Backend& be) {
  const int64_t n = int64_t(1) << 28;  // 1 GiB of f32 each way
  Tensor a = be.alloc(DType::F32, {n, 1}), b = be.alloc(DType::F32, {n, 1});
  be.copy_rows(a, 0, b, 0, n);
  be.synchronize();
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    auto t0 = clock_type::now();
    be.copy_rows(a, 0, b, 0, n);
    be.synchronize();
    best = std::max(best, 2.0 * double(n) * 4 / (ms_since(t0) / 1e3) / 1e9);
  }
  return best;
}

// Bytes a decode step of `batch` rows reads: every weight but the routed experts, the head, the
// routed experts the rows touch (expected distinct experts under uniform routing,
// E·(1 − (1 − k/E)^B)), and each row's cache entries (window + compressed + indexer keys).
struct StepBytes {
  double weights = 0, experts = 0, kv = 0;
  double total() const { return weights + experts + kv; }
};
StepBytes decode_bytes(const ModelWeights& w, int batch, int64_t context) {
  const ModelConfig& c = w.config;
  StepBytes s;
  const double E = c.n_routed_experts, k = c.n_active_experts;
  const double distinct = E * (1 - std::pow(1 - k / E, double(batch)));
  for (int l = 0; l < c.n_layers; ++l) {
    s.weights += w.block_bytes[size_t(l)] - E * w.expert_bytes[size_t(l)];
    s.experts += distinct * w.expert_bytes[size_t(l)];
    const int ratio = c.compress_ratios[size_t(l)];
    double entries = std::min<int64_t>(c.window, context);
    if (ratio == 4) entries += std::min<int64_t>(c.index_topk, context / 4);
    if (ratio == 128) entries += double(context / 128);
    s.kv += batch * entries * kv_layout::kEntryBytes;
    if (ratio == 4) s.kv += batch * double(context / 4) * double(kv_layout::kIndexFp4EntryBytes);
  }
  s.weights += double(c.vocab_size) * c.dim * 2;  // the head
  return s;
}

void run_profile(const ProfileArgs& a) {
  if (a.batch < 1 || a.batch > 256) fail("--batch-size {}: 1..256", a.batch);
  if (a.context < 1) fail("--context {}: at least 1", a.context);
  if (a.steps < 1) fail("--steps {}: at least 1", a.steps);
  LoadedModel m = load_model(a.model, a.backend);
  Dsv4Model& model = *m.model;
  Backend& be = *m.backend;
  const ModelConfig& c = model.config();
  if (a.context + a.steps + 4 > c.max_position_embeddings) fail("--context {} beyond the model's length", a.context);

  // Sequences at the requested context: prompts of spread-out ids, prefilled in chunks of 2048.
  std::vector<SeqId> seqs;
  auto t_prefill = clock_type::now();
  for (int s = 0; s < a.batch; ++s) {
    SeqId id = model.new_sequence();
    seqs.push_back(id);
    for (int64_t p = 0; p < a.context; p += 2048) {
      std::vector<int32_t> chunk;
      for (int64_t i = p; i < std::min<int64_t>(a.context, p + 2048); ++i)
        chunk.push_back(int32_t(2 + (i * 7919 + s * 104729) % (c.vocab_size - 2)));
      BatchItem item(id, chunk);
      item.return_logits = false;
      model.step({item});
    }
  }
  be.synchronize();
  const double prefill_ms = ms_since(t_prefill);
  auto batch = [&] {
    std::vector<BatchItem> b;
    for (SeqId id : seqs) {
      BatchItem item(id, {int32_t(3 + id % 1000)});
      item.return_logits = false;
      item.sampling = SamplingParams{};
      b.push_back(item);
    }
    return b;
  };
  // Warm-up: every workspace sized for this shape.
  for (int i = 0; i < 2; ++i) model.step(batch());
  be.synchronize();

  double plan_ms = 0, eager_ms = 0;
  for (int i = 0; i < a.steps; ++i) {
    const std::vector<BatchItem> b = batch();
    auto t0 = clock_type::now();
    StepPlan plan = model.plan_step(b);
    plan_ms += ms_since(t0);
    StepResult r = model.run_step(plan);
    model.finish_step(plan, r, b);  // reads the tokens back: waits for the step
    eager_ms += ms_since(t0);
  }
  plan_ms /= a.steps, eager_ms /= a.steps;

  double replay_ms = 0;
  bool replayed = false;
  if (be.can_capture()) {
    const std::vector<BatchItem> b = batch();
    StepPlan plan = model.plan_step(b);
    be.begin_capture();
    StepResult r;
    try {
      r = model.run_step(plan);
    } catch (...) {
      (void)be.end_capture();
      throw;
    }
    auto graph = be.end_capture();
    be.replay(*graph);  // the first replay uploads the graph
    be.synchronize();
    // Replays of one recorded step: the same work each time (it rewrites the same cache slots).
    auto t0 = clock_type::now();
    for (int i = 0; i < a.steps; ++i) be.replay(*graph);
    be.synchronize();
    replay_ms = ms_since(t0) / a.steps;
    model.finish_step(plan, r, b);
    replayed = true;
  }
  const double copy_gbs = copy_bandwidth_gbs(be);
  const StepBytes bytes = decode_bytes(model.weights(), a.batch, a.context);
  const double step_ms = replayed ? replay_ms : eager_ms;
  const double gbs = bytes.total() / (step_ms / 1e3) / 1e9;

  if (a.json) {
    nlohmann::json j = {{"model", a.model}, {"backend", be.name()}, {"batch_size", a.batch}, {"context", a.context},
                        {"layers", c.n_layers}, {"prefill_ms", prefill_ms}, {"eager_step_ms", eager_ms},
                        {"host_plan_ms", plan_ms}, {"replayed_step_ms", replayed ? nlohmann::json(replay_ms) : nlohmann::json()},
                        {"bytes_weights", bytes.weights}, {"bytes_experts", bytes.experts}, {"bytes_kv", bytes.kv},
                        {"step_gbs", gbs}, {"copy_gbs", copy_gbs}, {"tokens_per_s", a.batch / (step_ms / 1e3)}};
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("## decode step: {} — batch {}, context {}, {} layers ({})\n\n", a.model, a.batch, a.context, c.n_layers, be.name());
  fmt::print("| measure | value |\n|---|---|\n");
  fmt::print("| eager step (host plan + enqueue + token read-back), mean of {} | {:.3f} ms |\n", a.steps, eager_ms);
  fmt::print("| host plan (descriptor, pages, upload) | {:.3f} ms |\n", plan_ms);
  if (replayed) fmt::print("| replayed step (one recording, {} replays) | {:.3f} ms |\n", a.steps, replay_ms);
  fmt::print("| bytes per step: weights (dense + head) / routed experts (expected distinct) / KV | {:.1f} / {:.1f} / {:.2f} MB |\n",
             bytes.weights / 1e6, bytes.experts / 1e6, bytes.kv / 1e6);
  fmt::print("| bytes / {} step time | {:.0f} GB/s = {:.1f}% of the copy bandwidth ({:.0f} GB/s, read + write, this run) |\n",
             replayed ? "replayed" : "eager", gbs, 100 * gbs / copy_gbs, copy_gbs);
  fmt::print("| tokens/s at this batch | {:.1f} |\n", a.batch / (step_ms / 1e3));
  fmt::print("| prefill of {} × {} tokens (chunks of 2048, eager) | {:.1f} ms |\n", a.batch, a.context, prefill_ms);
}

}  // namespace

void add_profile_command(CLI::App& app) {
  auto a = std::make_shared<ProfileArgs>();
  auto* cmd = app.add_subcommand("profile", "Time one decode step of a model (eager and replayed) against its bytes");
  cmd->add_option("--model", a->model, "Checkpoint directory or synthetic:flash[,layers=N,...]")->required();
  cmd->add_option("--backend", a->backend, "Compute backend: cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->add_option("--batch-size", a->batch, "Sequences decoding together (1..256)")->capture_default_str();
  cmd->add_option("--context", a->context, "Tokens each sequence holds before the measured steps")->capture_default_str();
  cmd->add_option("--steps", a->steps, "Steps (and replays) averaged")->capture_default_str();
  cmd->add_flag("--json", a->json, "One JSON object instead of the table");
  cmd->callback([a] { run_profile(*a); });
}

}  // namespace dsv4::commands
