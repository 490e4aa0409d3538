// `dsv4 profile`: what one decode step costs on a model, and where its time goes — the eager step
// (host plan, enqueue, read-back), the same step replayed from its recording, the host's share,
// every op of the step timed on the device (backend/profiling_backend.h) with the bytes it moves,
// per op and per layer kind, against the copy bandwidth measured in the same run, and from the
// per-layer figures the step of DeepSeek-V4-Flash's whole schedule (commands/op_profile.h).
// --prefill N profiles one N-token prompt instead: its time, FLOP and TFLOP/s per op.
// With --tensor-parallel-size N every rank runs each phase and rank 0's ops and times are shown
// (its share of the heads and experts, and the all-reduces: "all_reduce …" rows).
// Markdown on stdout, or --json.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "backend/profiling_backend.h"
#include "commands/cli_options.h"
#include "commands/commands.h"
#include "commands/golden_commands.h"
#include "commands/op_profile.h"
#include "core/error.h"
#include "core/log.h"

namespace dsv4::commands {

namespace {

using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point t0) { return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count(); }

struct ProfileArgs {
  std::string model, backend = "cuda";
  int batch = 1, context = 4096, steps = 20;
  int64_t prefill = 0;
  bool json = false;
  std::string trace;  // --trace: a traced replay as a Chrome trace (JSON)
  ParallelOptions parallel;
};

// The model on its ranks, each with a profiling backend; rank 0's is the one reported.
struct Ranks {
  std::unique_ptr<TensorParallelModel> tp;
  std::vector<ProfilingBackend*> prof;
  int world() const { return int(prof.size()); }
  Dsv4Model& model(int r) { return tp->rank_model(r); }
  // fn(rank) on every rank at once (each phase of a split model runs on all ranks together).
  void each(const std::function<void(int)>& fn) { tp->on_every_rank(fn); }
  std::string backend_name() const {
    return world() > 1 ? fmt::format("{} × {}", world(), prof[0]->name()) : prof[0]->name();
  }
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

// A prompt of spread-out ids (any ids do for timing; these avoid one repeated token).
std::vector<int32_t> prompt_ids(int64_t from, int64_t to, int salt, int vocab) {
  std::vector<int32_t> ids;
  for (int64_t i = from; i < to; ++i) ids.push_back(int32_t(2 + (i * 7919 + int64_t(salt) * 104729) % (vocab - 2)));
  return ids;
}

std::vector<ProfilingBackend::OpRecord> profiled_step(ProfilingBackend& prof, Dsv4Model& model,
                                                      const std::vector<BatchItem>& b) {
  StepPlan plan = model.plan_step(b);
  prof.start();
  StepResult r = model.run_step(plan);
  auto records = prof.stop();
  model.finish_step(plan, r, b);
  return records;
}

// One prompt of `a.prefill` tokens in one step: its time, its ops, model TFLOP/s.
void profile_prefill(const ProfileArgs& a, Ranks& ranks, double copy_gbs) {
  TensorParallelModel& model = *ranks.tp;
  const ModelConfig& c = model.config();
  if (a.prefill + 1 > c.max_position_embeddings) fail("--prefill {} beyond the model's length", a.prefill);
  auto run = [&](bool profiled) {
    SeqId id = model.new_sequence();
    BatchItem item(id, prompt_ids(0, a.prefill, 0, c.vocab_size));
    item.return_logits = false;
    item.sampling = SamplingParams{};
    std::vector<ProfilingBackend::OpRecord> records;
    auto t0 = clock_type::now();
    if (profiled)
      ranks.each([&](int r) {
        auto rec = profiled_step(*ranks.prof[size_t(r)], ranks.model(r), {item});
        if (r == 0) records = std::move(rec);
      });
    else
      model.step({item});  // reads the token back: waits for the step
    const double ms = ms_since(t0);
    model.free_sequence(id);
    return std::make_pair(ms, records);
  };
  (void)run(false);  // warm-up: workspaces sized for this shape
  const int reps = std::min(a.steps, 3);
  double step_ms = 0;
  for (int i = 0; i < reps; ++i) step_ms += run(false).first / reps;
  const OpProfile ops = summarise_ops({run(true).second}, c);
  const double tflops = ops.step.flops / (step_ms / 1e3) / 1e12;
  if (a.json) {
    nlohmann::json j = {{"model", a.model}, {"backend", ranks.backend_name()}, {"tensor_parallel_size", ranks.world()},
                        {"prefill_tokens", a.prefill}, {"layers", c.n_layers},
                        {"step_ms", step_ms}, {"flops", ops.step.flops}, {"tflops", tflops}, {"copy_gbs", copy_gbs}};
    j["profile"] = op_tables_json(ops, c);
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("## prefill: {} — one prompt of {} tokens in one step, {} layers ({})\n\n", a.model, a.prefill, c.n_layers,
             ranks.backend_name());
  fmt::print("| measure | value |\n|---|---|\n");
  fmt::print("| step (plan + enqueue + sampled token read back), mean of {} | {:.1f} ms |\n", reps, step_ms);
  fmt::print("| FLOP of the step (matrix products: linears, experts as routed, attention over listed entries, indexer, head) | {:.2f} TFLOP |\n",
             ops.step.flops / 1e12);
  fmt::print("| model TFLOP/s (FLOP / step time) | {:.1f} |\n", tflops);
  fmt::print("| sum of the op times (each op alone) | {:.1f} ms |\n\n", ops.step_ms);
  print_op_tables(ops, c, copy_gbs, true);
}

void profile_decode(const ProfileArgs& a, Ranks& ranks, double copy_gbs) {
  TensorParallelModel& model = *ranks.tp;
  const ModelConfig& c = model.config();
  auto sync_all = [&] { ranks.each([&](int r) { ranks.prof[size_t(r)]->synchronize(); }); };
  if (a.context + 3 * a.steps + 4 > c.max_position_embeddings) fail("--context {} beyond the model's length", a.context);
  // Sequences at the requested context, prefilled in chunks of 2048.
  std::vector<SeqId> seqs;
  auto t_prefill = clock_type::now();
  for (int s = 0; s < a.batch; ++s) {
    SeqId id = model.new_sequence();
    seqs.push_back(id);
    for (int64_t p = 0; p < a.context; p += 2048) {
      BatchItem item(id, prompt_ids(p, std::min<int64_t>(a.context, p + 2048), s, c.vocab_size));
      item.return_logits = false;
      model.step({item});
    }
  }
  sync_all();
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
  for (int i = 0; i < 2; ++i) model.step(batch());  // warm-up: every workspace sized for this shape
  sync_all();

  // The eager step, and the host's parts of it: planning, enqueueing run_step, the read-back
  // (rank 0's; every rank runs its own at the same time).
  double plan_ms = 0, enqueue_ms = 0, eager_ms = 0;
  for (int i = 0; i < a.steps; ++i) {
    const std::vector<BatchItem> b = batch();
    ranks.each([&](int rank) {
      Dsv4Model& m = ranks.model(rank);
      auto t0 = clock_type::now();
      StepPlan plan = m.plan_step(b);
      const double planned = ms_since(t0);
      auto t1 = clock_type::now();
      StepResult r = m.run_step(plan);
      const double enqueued = ms_since(t1);
      m.finish_step(plan, r, b);
      if (rank == 0) plan_ms += planned, enqueue_ms += enqueued, eager_ms += ms_since(t0);
    });
  }
  plan_ms /= a.steps, enqueue_ms /= a.steps, eager_ms /= a.steps;

  std::vector<std::vector<ProfilingBackend::OpRecord>> records;
  for (int i = 0; i < a.steps; ++i) {
    const std::vector<BatchItem> b = batch();
    ranks.each([&](int rank) {
      auto rec = profiled_step(*ranks.prof[size_t(rank)], ranks.model(rank), b);
      if (rank == 0) records.push_back(std::move(rec));
    });
  }
  const OpProfile ops = summarise_ops(records, c);

  double replay_ms = 0;
  int64_t replay_items = 0;  // the recording's kernels and copies
  std::vector<CapturedWork::ItemKind> replay_kinds;
  ReplayView replay;
  const bool replayed = ranks.model(0).can_record();
  if (replayed) {
    const std::vector<BatchItem> b = batch();
    ranks.each([&](int rank) {
      Dsv4Model& m = ranks.model(rank);
      Backend& be = *ranks.prof[size_t(rank)];
      StepPlan plan = m.plan_step(b);
      be.begin_capture();
      StepResult r;
      try {
        r = m.run_step(plan);
      } catch (...) {
        (void)be.end_capture();
        throw;
      }
      auto graph = be.end_capture();
      be.replay(*graph);  // the first replay uploads the graph
      be.synchronize();
      // Replays of one recorded step: the same work each time (it rewrites the same cache slots);
      // the ranks' replays meet in their all-reduces.
      auto t0 = clock_type::now();
      for (int i = 0; i < a.steps; ++i) be.replay(*graph);
      be.synchronize();
      if (rank == 0) replay_ms = ms_since(t0) / a.steps, replay_items = graph->items(), replay_kinds = graph->item_kinds();
      // The same replays traced on the device, one GPU only: a split model's replays meet in
      // collectives, which one rank tracing alone would leave waiting.
      if (rank == 0 && ranks.world() == 1) {
        std::string why_not;
        const auto traces = be.trace_replays(*graph, a.steps, why_not);
        replay = replay_view(traces, ranks.prof[0]->recorded_ops(), c);
        replay.why_not = why_not;
        if (!a.trace.empty() && !traces.empty()) write_chrome_trace(a.trace, traces.back(), ranks.prof[0]->recorded_ops(), c);
      } else if (rank == 0) {
        replay.why_not = "traced on one GPU only";
      }
      m.finish_step(plan, r, b);
    });
  }
  if (!a.trace.empty() && !replay.traced)
    fmt::print(stderr, "--trace {}: not written ({})\n", a.trace,
               replayed ? replay.why_not : "this backend does not record and replay a step");
  // The step as the engine runs it: model.step with the model's decode mode (recorded graphs where
  // the backend records: a fixed-shape plan, its descriptor refilled, the replay, sampling as
  // called, the token read back), the host's work included.
  double served_ms = 0;
  const int64_t ahead_before = ranks.model(0).graph_stats().planned_ahead;
  for (int i = 0; i < a.steps; ++i) {
    const std::vector<BatchItem> b = batch();
    auto t0 = clock_type::now();
    model.step(b);
    served_ms += ms_since(t0) / a.steps;
  }
  const auto graphs = ranks.model(0).graph_stats();
  const int64_t served_ahead = graphs.planned_ahead - ahead_before;
  const double step_ms = replayed ? replay_ms : eager_ms;
  // What a step must move: the weights its ops read (routed experts as the rows chose them) and
  // the cache entries read and written. Activations are left out: at decode sizes they stay in L2.
  const double must_move = ops.step.weights + ops.step.cache;
  const double step_gbs = must_move / (step_ms / 1e3) / 1e9;
  const double ratio = replayed ? replay_ms / ops.step_ms : eager_ms / ops.step_ms;
  const FlashProjection flash = project_flash(ops, c);
  const double flash_ms = flash.op_sum_ms() * ratio;
  const double flash_bytes = flash_step_bytes(ops, c);
  const auto flash_copy_fraction = [&](double ms) { return flash_bytes / (ms / 1e3) / 1e9 / copy_gbs; };

  if (a.json) {
    nlohmann::json j = {{"model", a.model}, {"backend", ranks.backend_name()}, {"tensor_parallel_size", ranks.world()},
                        {"batch_size", a.batch}, {"context", a.context},
                        {"layers", c.n_layers}, {"prefill_ms", prefill_ms}, {"eager_step_ms", eager_ms},
                        {"host_plan_ms", plan_ms}, {"host_enqueue_ms", enqueue_ms},
                        {"replayed_step_ms", replayed ? nlohmann::json(replay_ms) : nlohmann::json()},
                        {"replayed_step_items", replayed ? nlohmann::json(replay_items) : nlohmann::json()},
                        {"served_step_ms", served_ms}, {"decode_graphs_replayed", graphs.replayed},
                        {"served_steps_planned_ahead", served_ahead},
                        {"step_gbs", step_gbs}, {"copy_gbs", copy_gbs}, {"tokens_per_s", a.batch / (step_ms / 1e3)}};
    if (replayed) {
      nlohmann::json kinds = nlohmann::json::array();
      for (auto& k : replay_kinds)
        kinds.push_back(nlohmann::json{{"name", k.name}, {"count", k.count}, {"early", k.early}});
      j["replayed_step_item_kinds"] = kinds;
    }
    j["profile"] = op_tables_json(ops, c, &replay);
    if (replayed) j["replay_trace"] = replay_view_json(replay);
    if (const FlashProjection r = replay.traced ? project_flash(replay, c) : FlashProjection{}; r.valid)
      j["flash_projection_replayed"] = {{"swa_ms", r.swa_ms}, {"csa_ms", r.csa_ms}, {"hca_ms", r.hca_ms}, {"embed_ms", r.embed_ms},
                                        {"head_ms", r.head_ms}, {"step_ms", r.op_sum_ms()},
                                        {"tokens_per_s", a.batch / (r.op_sum_ms() / 1e3)},
                                        {"copy_fraction", flash_copy_fraction(r.op_sum_ms())}};
    if (const FlashProjection o = replay.traced ? project_flash_overlapped(split_regions(ops, replay, c), copy_gbs, c)
                                                : FlashProjection{};
        o.valid)
      j["flash_projection_overlapped"] = {{"swa_ms", o.swa_ms}, {"csa_ms", o.csa_ms}, {"hca_ms", o.hca_ms},
                                          {"embed_ms", o.embed_ms}, {"head_ms", o.head_ms}, {"step_ms", o.op_sum_ms()},
                                          {"tokens_per_s", a.batch / (o.op_sum_ms() / 1e3)},
                                          {"copy_fraction", flash_copy_fraction(o.op_sum_ms())}};
    if (flash.valid)
      j["flash_projection"] = {{"swa_ms", flash.swa_ms}, {"csa_ms", flash.csa_ms}, {"hca_ms", flash.hca_ms},
                               {"embed_ms", flash.embed_ms}, {"head_ms", flash.head_ms}, {"op_sum_ms", flash.op_sum_ms()},
                               {"step_ms", flash_ms}, {"tokens_per_s", a.batch / (flash_ms / 1e3)},
                               {"step_bytes", flash_bytes}, {"copy_fraction", flash_copy_fraction(flash_ms)}};
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("## decode step: {} — batch {}, context {}, {} layers ({})\n\n", a.model, a.batch, a.context, c.n_layers,
             ranks.backend_name());
  fmt::print("| measure | value |\n|---|---|\n");
  fmt::print("| eager step (host plan + enqueue + token read-back), mean of {} | {:.3f} ms |\n", a.steps, eager_ms);
  fmt::print("| host: plan (descriptor, pages, upload) / enqueue of the step's ops | {:.3f} / {:.3f} ms |\n", plan_ms, enqueue_ms);
  fmt::print("| sum of the op times (device, each op alone), mean of {} | {:.3f} ms |\n", a.steps, ops.step_ms);
  if (replayed)
    fmt::print("| replayed step (one recording, {} replays) | {:.3f} ms = {:.2f} × the op sum |\n", a.steps, replay_ms, ratio);
  if (replayed && replay_items > 0)
    fmt::print("| items in the recording (kernels, copies) / replayed µs per item | {} / {:.2f} µs |\n", replay_items,
               replay_ms * 1e3 / double(replay_items));
  fmt::print("| served step (model.step: {}, host work and token read-back included; {} of {} planned while the step "
             "before ran), mean of {} | {:.3f} ms |\n",
             ranks.model(0).decode_graphs() == DecodeGraphs::Record ? "the bucket's recorded graph replayed" : "run as called",
             served_ahead, a.steps, a.steps, served_ms);
  fmt::print("| bytes per step: weights (routed experts as chosen) / cache / activations | {:.1f} / {:.2f} / {:.2f} MB |\n",
             ops.step.weights / 1e6, ops.step.cache / 1e6, ops.step.activations / 1e6);
  fmt::print("| (weights + cache) / {} step time | {:.0f} GB/s = {:.1f}% of the copy bandwidth ({:.0f} GB/s, read + write, this run) |\n",
             replayed ? "replayed" : "eager", step_gbs, 100 * step_gbs / copy_gbs, copy_gbs);
  fmt::print("| tokens/s at this batch | {:.1f} |\n", a.batch / (step_ms / 1e3));
  fmt::print("| prefill of {} × {} tokens (chunks of 2048, eager) | {:.1f} ms |\n", a.batch, a.context, prefill_ms);
  if (replayed && replay.traced)
    fmt::print("| traced replay (the replays above again, each item's start and end on the device; the op table's "
               "replayed column) | {:.3f} ms |\n",
               replay.step_us / 1e3);
  else if (replayed)
    fmt::print("| traced replay | not traced: {} |\n", replay.why_not);
  fmt::print("\n");
  print_op_tables(ops, c, copy_gbs, false, &replay);
  if (replay.traced) print_replay_kernels(replay, 30);
  if (!replay_kinds.empty()) {
    int64_t early = 0;
    for (auto& k : replay_kinds) early += k.early;
    fmt::print("### the recording's items by kind ({} of {} entered by a programmatic edge: scheduled before the item "
               "ahead completes)\n\n| item | count | programmatic |\n|---|---:|---:|\n",
               early, replay_items);
    for (auto& k : replay_kinds) fmt::print("| {} | {} | {} |\n", k.name, k.count, k.early);
    fmt::print("\n");
  }
  if (flash.valid) {
    fmt::print("### projected: DeepSeek-V4-Flash's 43 layers on one GPU (as if it fit)\n\n");
    fmt::print("bytes a step: {} SWA, {} CSA and {} HCA layers of the means measured here, embed and head = {:.2f} GB "
               "(weights + cache); each step time below gives its share of the copy bandwidth ({:.0f} GB/s, this run)\n\n",
               FlashProjection::kSwa, FlashProjection::kCsa, FlashProjection::kHca, flash_bytes / 1e9, copy_gbs);
    const auto at_copy = [&](double ms) { return fmt::format("{:.1f}% of copy", 100 * flash_copy_fraction(ms)); };
    fmt::print("op sum = {} SWA × {:.1f} µs + {} CSA × {:.1f} µs + {} HCA × {:.1f} µs + embed {:.1f} µs + head {:.1f} µs = {:.3f} ms;\n",
               FlashProjection::kSwa, flash.swa_ms * 1e3, FlashProjection::kCsa, flash.csa_ms * 1e3, FlashProjection::kHca,
               flash.hca_ms * 1e3, flash.embed_ms * 1e3, flash.head_ms * 1e3, flash.op_sum_ms());
    fmt::print("× {:.2f} ({} step / op sum, this run) = {:.3f} ms per step ({}) → {:.0f} tok/s at batch {} ({:.1f} tok/s "
               "per sequence)\n",
               ratio, replayed ? "replayed" : "eager", flash_ms, at_copy(flash_ms), a.batch / (flash_ms / 1e3), a.batch,
               1e3 / flash_ms);
    const FlashProjection r = replay.traced ? project_flash(replay, c) : FlashProjection{};
    if (r.valid)
      fmt::print("\nfrom the traced replay's layer shares: {} SWA × {:.1f} µs + {} CSA × {:.1f} µs + {} HCA × {:.1f} µs + "
                 "embed {:.1f} µs + head {:.1f} µs = {:.3f} ms per step ({}) → {:.0f} tok/s at batch {}\n",
                 FlashProjection::kSwa, r.swa_ms * 1e3, FlashProjection::kCsa, r.csa_ms * 1e3, FlashProjection::kHca,
                 r.hca_ms * 1e3, r.embed_ms * 1e3, r.head_ms * 1e3, r.op_sum_ms(), at_copy(r.op_sum_ms()),
                 a.batch / (r.op_sum_ms() / 1e3), a.batch);
    const FlashProjection o =
        replay.traced ? project_flash_overlapped(split_regions(ops, replay, c), copy_gbs, c) : FlashProjection{};
    if (o.valid)
      fmt::print("\nif each layer read its weights during its stretches (the layer table's overlapped column: the bound of "
                 "a resident layer): {} SWA × {:.1f} µs + {} CSA × {:.1f} µs + {} HCA × {:.1f} µs + embed {:.1f} µs + "
                 "head {:.1f} µs = {:.3f} ms per step ({}) → {:.0f} tok/s at batch {}\n",
                 FlashProjection::kSwa, o.swa_ms * 1e3, FlashProjection::kCsa, o.csa_ms * 1e3, FlashProjection::kHca,
                 o.hca_ms * 1e3, o.embed_ms * 1e3, o.head_ms * 1e3, o.op_sum_ms(), at_copy(o.op_sum_ms()),
                 a.batch / (o.op_sum_ms() / 1e3), a.batch);
  }
}

void run_profile(const ProfileArgs& a) {
  if (a.batch < 1 || a.batch > 256) fail("--batch-size {}: 1..256", a.batch);
  if (a.context < 1) fail("--context {}: at least 1", a.context);
  if (a.steps < 1) fail("--steps {}: at least 1", a.steps);
  if (a.prefill < 0) fail("--prefill {}: 0 (a decode profile) or a prompt length", a.prefill);
  check_parallel_options(a.model, a.parallel);
  const int world = a.parallel.tensor_parallel_size;
  Ranks ranks;
  ranks.prof.assign(size_t(world), nullptr);
  ranks.tp = load_parallel_model(a.model, a.backend, {world, a.parallel.expert_parallel},
                                 [&](int r, std::unique_ptr<Backend> b) {
                                   auto p = std::make_unique<ProfilingBackend>(std::move(b));
                                   ranks.prof[size_t(r)] = p.get();
                                   return std::unique_ptr<Backend>(std::move(p));
                                 });
  for (int r = 0; r < world; ++r) {
    ProfilingBackend* p = ranks.prof[size_t(r)];
    ranks.model(r).on_block = [p](int region) { p->set_region(region); };
  }
  double copy_gbs = 0;
  ranks.each([&](int r) {
    if (r == 0) copy_gbs = copy_bandwidth_gbs(*ranks.prof[0]);  // rank 0's GPU alone
  });
  if (a.prefill) profile_prefill(a, ranks, copy_gbs);
  else profile_decode(a, ranks, copy_gbs);
}

}  // namespace

void add_profile_command(CLI::App& app) {
  auto a = std::make_shared<ProfileArgs>();
  auto* cmd = app.add_subcommand("profile", "Time one decode step of a model (eager and replayed) against its bytes");
  cmd->add_option("--model", a->model, "Checkpoint directory or synthetic:flash[,layers=N,...]")->required();
  cmd->add_option("--backend", a->backend, "Compute backend: cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  add_parallel_options(cmd, a->parallel);
  cmd->add_option("--batch-size", a->batch, "Sequences decoding together (1..256)")->capture_default_str();
  cmd->add_option("--context", a->context, "Tokens each sequence holds before the measured steps")->capture_default_str();
  cmd->add_option("--steps", a->steps, "Steps (and replays) averaged")->capture_default_str();
  cmd->add_option("--prefill", a->prefill,
                  "Profile one prompt of this many tokens in one step (model TFLOP/s) instead of a decode step")
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "One JSON object instead of the tables");
  cmd->add_option("--trace", a->trace,
                  "Write the last traced replay of the decode step to this file as a Chrome trace (JSON: "
                  "chrome://tracing, Perfetto): each item on the device's clock, named by kernel and op");
  cmd->callback([a] { run_profile(*a); });
}

}  // namespace dsv4::commands
