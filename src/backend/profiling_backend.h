// A backend that runs another and, while recording, times every op it is asked for (`dsv4
// profile`). Each op is bracketed by two marks on the inner backend's queue of work, so its time
// is the work's own and not the host's (the host enqueues ahead of the device); the marks stop
// kernels of neighbouring ops from overlapping, which is why a profile also states the replayed
// step next to the sum of its ops. Bytes are what each op must move: its weights, activations in
// and out, and cache entries — where they depend on data (experts touched, entries listed, keys
// scored) they are counted from the op's index tensors after the step.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace dsv4 {

class ProfilingBackend final : public Backend {
 public:
  // Bytes an op moves — weights read, cache entries and compressor state read or written, and
  // activations in and out (mostly from L2 at decode sizes; counted apart for that reason) — and
  // its arithmetic (multiply-adds count 2; the matrix products only).
  struct OpCost {
    double weights = 0, cache = 0, activations = 0, flops = 0;
    double total() const { return weights + cache + activations; }
    void add(const OpCost& o, double times = 1) {
      weights += o.weights * times, cache += o.cache * times, activations += o.activations * times, flops += o.flops * times;
    }
  };
  struct OpRecord {
    std::string op;  // "linear attn.wq_b", "linears attn.wq_a + attn.wkv", "sparse_attention", ...
    int region = -1;  // set_region's value when it was called
    double ms = 0;
    OpCost cost;
    // Work begun early for a later op of the same name (moe_begin's shared expert, moe_experts'
    // own): its time and bytes add to that op's row, but it is not a call.
    bool continues = false;
  };

  explicit ProfilingBackend(std::unique_ptr<Backend> inner);
  Backend& inner() { return *inner_; }

  // Recording: start() forgets earlier records; stop() waits for the work and resolves times and
  // bytes. Not recording, every call only forwards (a step recorded for replay is made so).
  void start();
  const std::vector<OpRecord>& stop();
  // The region (a layer index, say) the next ops are attributed to.
  void set_region(int region) { region_ = region; }
  // While a step is recorded for replay, each op call's items in the recording: [from, to) in the
  // order the recording made them (Backend::recorded_items), for the traced replay's view by op.
  struct RecordedOp {
    std::string op;
    int region = -1;
    int64_t from = 0, to = 0;
  };
  const std::vector<RecordedOp>& recorded_ops() const { return recorded_ops_; }

  std::string name() const override { return inner_->name(); }
  const void* place_weight(const void* host, size_t bytes) override { return inner_->place_weight(host, bytes); }
  void prepare_experts(MoeWeights& w, float swiglu_limit) override { inner_->prepare_experts(w, swiglu_limit); }
  void synchronize() override { inner_->synchronize(); }
  void collective(const std::string& op, const Tensor& x, const std::function<void()>& run) override;
  // Forwarded only when not timing: each timed op runs alone, in the order called (a recorded step
  // keeps its branches).
  void branch_begin() override {
    if (!on_) inner_->branch_begin();
  }
  void branch_end() override {
    if (!on_) inner_->branch_end();
  }
  void branch_join() override {
    if (!on_) inner_->branch_join();
  }
  bool can_capture() const override { return inner_->can_capture(); }
  uint64_t recording_epoch() const override { return inner_->recording_epoch(); }
  void begin_capture() override;
  std::unique_ptr<CapturedWork> end_capture() override;
  void replay(const CapturedWork& work) override { inner_->replay(work); }
  int64_t recorded_items() const override { return inner_->recorded_items(); }
  std::vector<std::vector<CapturedWork::TracedItem>> trace_replays(const CapturedWork& work, int replays,
                                                                   std::string& why_not) override {
    return inner_->trace_replays(work, replays, why_not);
  }
  int mark() override { return inner_->mark(); }
  double elapsed_ms(int from, int to) override { return inner_->elapsed_ms(from, to); }
  void clear_marks() override { inner_->clear_marks(); }

  Tensor alloc(DType dtype, std::vector<int64_t> shape) override { return inner_->alloc(dtype, std::move(shape)); }
  Tensor from_host(DType dtype, std::vector<int64_t> shape, const void* data) override;
  void upload(const Tensor& dst, const void* data) override { inner_->upload(dst, data); }
  Tensor generate(const RandomFill& fill, DType dtype, std::vector<int64_t> shape) override {
    return inner_->generate(fill, dtype, std::move(shape));
  }
  void to_host(const Tensor& t, void* dst) override { inner_->to_host(t, dst); }
  void copy_rows(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row, int64_t rows) override;
  Tensor gather_rows(const Tensor& src, const Tensor& rows) override;

  Tensor embed(const Tensor& ids, const uint16_t* table, int dim) override;
  Tensor rms_norm(const Tensor& x, const uint16_t* weight, float eps) override;
  void head_rms_norm(Tensor& x, int head_dim, float eps) override;
  void rope(Tensor& x, int head_dim, int rope_dim, const Tensor& positions, const RopeTable& table, bool inverse) override;
  void norm_rope(Tensor& x, int head_dim, const uint16_t* weight, float eps, int rope_dim, const Tensor& positions,
                 const RopeTable& table, bool fp8_nope) override;
  void head_norm_rope(Tensor& x, int head_dim, float eps, int rope_dim, const Tensor& positions,
                      const RopeTable& table) override;
  void fp8_simulate(Tensor& x, int row_width, int channels) override;
  void hadamard_fp4_simulate(Tensor& x, int width) override;
  Tensor add(const Tensor& a, const Tensor& b) override;
  Tensor scale(const Tensor& x, float s) override;

  Tensor linear(const Tensor& x, const LinearWeight& w) override;
  std::vector<Tensor> linears(const Tensor& x, const std::vector<const LinearWeight*>& ws) override;
  std::vector<Tensor> linears_f32(const Tensor& x, const std::vector<std::pair<const uint16_t*, int>>& ws,
                                  int in) override;
  Tensor linear_bf16(const Tensor& x, const uint16_t* w, int out, int in) override;
  Tensor linear_f32(const Tensor& x, const uint16_t* w, int out, int in) override;
  Tensor grouped_out_proj(const Tensor& o, const LinearWeight& wo_a, int groups, int rank) override;

  Tensor hc_pre(const Tensor& X, const HyperConnection& hc, int hc_mult, int iters, float norm_eps, float hc_eps,
                Tensor* post, Tensor* comb, const uint16_t* norm) override;
  Tensor hc_post(const Tensor& y, const Tensor& X, const Tensor& post, const Tensor& comb) override;
  Tensor hc_post_pre(const Tensor& y, const Tensor& X, Tensor* Xa, const HyperConnection& hc, int hc_mult, int iters,
                     float norm_eps, float hc_eps, Tensor* post, Tensor* comb, const uint16_t* norm) override;
  Tensor hc_head(const Tensor& X, const HyperConnection& hc, int hc_mult, float norm_eps, float hc_eps,
                 const uint16_t* norm) override;

  void grow_pool(EntryPool& pool, int64_t pages) override { inner_->grow_pool(pool, pages); }
  void write_entries(const Tensor& values, const Tensor& entries, EntryPool& pool) override;
  void copy_entries(const Tensor& src, const Tensor& dst, EntryPool& pool) override;
  Tensor step_indices(const StepIndexArgs& args) override;
  std::vector<Tensor> step_index_sets(const std::vector<StepIndexArgs>& sets) override;
  Tensor sparse_attention(const Tensor& q, int n_heads, int head_dim, const EntryPool& kv_pool, const Tensor& entry_lists,
                          const float* sink, float scale) override;
  Tensor indexer_topk(const Tensor& q, const Tensor& head_weights, int n_heads, const EntryPool& key_pool,
                      const KeyTables& keys, int k) override;

  void grow_compressor_states(CompressorStates& states, int64_t slots) override { inner_->grow_compressor_states(states, slots); }
  void compressor_state_init(CompressorStates& states, int64_t slot) override { inner_->compressor_state_init(states, slot); }
  Tensor compressor_update(const Tensor& a, const Tensor& g, const StepTables& step, const Tensor& slots,
                           int64_t capacity, int64_t max_span_rows, const float* ape, CompressorStates& states) override;
  Tensor to_bf16(const Tensor& x) override;

  Routing route(const Tensor& x, const MoeWeights& w, const Tensor& token_ids, int k, float route_scale) override;
  void moe_begin(const Tensor& x, const MoeWeights& w, float swiglu_limit) override;
  Tensor moe_experts(const Tensor& x, const Routing& r, const MoeWeights& w, float swiglu_limit) override;

  // Tensor parallelism's pieces, under the names of the ops they split (one rank's share of them).
  Tensor linear_partial(const Tensor& x, const LinearWeight& w) override;
  Tensor moe_expert_partials(const Tensor& x, const Routing& r, const MoeWeights& w, float swiglu_limit) override;
  Tensor moe_combine(const Tensor& partials, const Routing& r) override;

  Tensor logits(const Tensor& h, const uint16_t* head, int vocab) override;
  Tensor sample(const Tensor& logits, const Tensor& params, const Tensor& counters) override;
  void apply_penalties(Tensor& logits, const Tensor& params, const Tensor& rows, const Tensor& ids,
                       const Tensor& counts) override;
  LogprobRows logprobs(const Tensor& logits, const Tensor& chosen, int top_n) override;

 private:
  struct Pending {
    OpRecord record;
    int from = 0, to = 0;
    std::function<OpCost()> cost_after;  // data-dependent costs, read after the step
  };
  Tensor timed_moe(const Tensor& x, const Routing& r, const MoeWeights& w, const std::function<Tensor()>& run);
  // Runs f between two marks as op `op` moving `bytes` (+ its result's bytes for a Tensor);
  // `continues`: OpRecord::continues.
  template <typename F>
  auto timed(std::string op, OpCost bytes, F&& f, std::function<OpCost()> after = {}, bool continues = false);

  std::unique_ptr<Backend> inner_;
  bool on_ = false, recording_ = false;
  int region_ = -1;
  std::vector<RecordedOp> recorded_ops_;
  std::vector<Pending> pending_;
  std::vector<OpRecord> records_;
};

// Bytes of one linear's weight as stored (values + scales).
double linear_weight_bytes(const LinearWeight& w);

}  // namespace dsv4
