#include "backend/profiling_backend.h"

#include <algorithm>
#include <set>
#include <type_traits>

#include <fmt/format.h>

#include "backend/kv_cache_layout.h"
#include "core/error.h"

namespace dsv4 {

double linear_weight_bytes(const LinearWeight& w) {
  const double n = double(w.out) * w.in;
  switch (w.format) {
    case WeightFormat::BF16: return 2 * n;
    case WeightFormat::FP8_BLOCK: return n + double((w.out + 127) / 128) * double((w.in + 127) / 128);
    case WeightFormat::MXFP4: return n / 2 + n / 32;
    case WeightFormat::NVFP4: return n / 2 + n / 16;
  }
  return 0;
}

namespace {

double bytes(const Tensor& t) { return double(t.nbytes()); }

// "layers.3.attn.wq_a" → "attn.wq_a": the layer is the record's region.
std::string weight_label(const std::string& name) {
  if (name.rfind("layers.", 0) == 0) {
    const size_t dot = name.find('.', 7);
    if (dot != std::string::npos) return name.substr(dot + 1);
  }
  return name;
}

std::vector<int32_t> read_i32(Backend& be, const Tensor& t) {
  std::vector<int32_t> v(size_t(t.numel()));
  if (!v.empty()) be.to_host(t, v.data());
  return v;
}

double entry_bytes(EntryKind kind) {
  return kind == EntryKind::KV ? double(kv_layout::kEntryBytes) : double(kv_layout::kIndexFp4EntryBytes);
}

}  // namespace

ProfilingBackend::ProfilingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {
  DSV4_CHECK(inner_, "ProfilingBackend: no backend");
}

void ProfilingBackend::start() {
  pending_.clear();
  records_.clear();
  inner_->clear_marks();
  on_ = true;
}

const std::vector<ProfilingBackend::OpRecord>& ProfilingBackend::stop() {
  on_ = false;
  inner_->synchronize();
  records_.clear();
  for (Pending& p : pending_) {
    p.record.ms = inner_->elapsed_ms(p.from, p.to);
    if (p.cost_after) p.record.cost.add(p.cost_after());
    records_.push_back(std::move(p.record));
  }
  pending_.clear();
  inner_->clear_marks();
  return records_;
}

void ProfilingBackend::begin_capture() {
  DSV4_CHECK(!on_, "ProfilingBackend: stop recording ops before recording a step for replay");
  inner_->begin_capture();
  recorded_ops_.clear();
  recording_ = true;
}

std::unique_ptr<CapturedWork> ProfilingBackend::end_capture() {
  recording_ = false;
  return inner_->end_capture();
}

template <typename F>
auto ProfilingBackend::timed(std::string op, OpCost moved, F&& f, std::function<OpCost()> after, bool continues) {
  using R = std::invoke_result_t<F>;
  if (recording_) {
    RecordedOp r{std::move(op), region_, inner_->recorded_items(), 0};
    // Recorded in call order, also when f throws; `to` is set once f has recorded its items.
    recorded_ops_.push_back(r);
    const size_t at = recorded_ops_.size() - 1;
    struct SetTo {
      ProfilingBackend* self;
      size_t at;
      ~SetTo() { self->recorded_ops_[at].to = self->inner_->recorded_items(); }
    } set_to{this, at};
    return f();
  }
  if (!on_) return f();
  Pending p;
  p.record.op = std::move(op);
  p.record.region = region_;
  p.record.cost = moved;
  p.record.continues = continues;
  p.cost_after = std::move(after);
  p.from = inner_->mark();
  if constexpr (std::is_void_v<R>) {
    f();
    p.to = inner_->mark();
    pending_.push_back(std::move(p));
  } else {
    R out = f();
    p.to = inner_->mark();
    if constexpr (std::is_same_v<R, Tensor>) p.record.cost.activations += bytes(out);
    pending_.push_back(std::move(p));
    return out;
  }
}

namespace {
using OpCost = ProfilingBackend::OpCost;
OpCost act(double a) { return {0, 0, a, 0}; }
OpCost weights_and(double w, double a, double flops = 0) { return {w, 0, a, flops}; }
OpCost cache_and(double c, double a, double flops = 0) { return {0, c, a, flops}; }
double rows(const Tensor& x) { return double(x.rows()); }
}  // namespace

Tensor ProfilingBackend::from_host(DType dtype, std::vector<int64_t> shape, const void* data) {
  return timed("from_host", {}, [&] { return inner_->from_host(dtype, shape, data); });
}
void ProfilingBackend::collective(const std::string& op, const Tensor& x, const std::function<void()>& run) {
  // The payload each rank sends and receives; the wait for the other ranks is part of the time.
  timed(op, act(2 * bytes(x)), [&] { inner_->collective(op, x, run); });
}

void ProfilingBackend::copy_rows(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row, int64_t rows) {
  const double row_bytes = src.rows() ? bytes(src) / double(src.rows()) : 0;
  timed("copy_rows", act(2 * row_bytes * double(rows)), [&] { inner_->copy_rows(src, src_row, dst, dst_row, rows); });
}
Tensor ProfilingBackend::gather_rows(const Tensor& src, const Tensor& rows) {
  return timed("gather_rows", act(bytes(rows)), [&] { return inner_->gather_rows(src, rows); });
}

Tensor ProfilingBackend::embed(const Tensor& ids, const uint16_t* table, int dim) {
  return timed("embed", weights_and(double(ids.numel()) * dim * 2, bytes(ids)), [&] { return inner_->embed(ids, table, dim); });
}
Tensor ProfilingBackend::rms_norm(const Tensor& x, const uint16_t* weight, float eps) {
  const double D = x.rows() ? double(x.numel() / x.rows()) : 0;
  return timed("rms_norm", weights_and(weight ? 2 * D : 0, bytes(x)), [&] { return inner_->rms_norm(x, weight, eps); });
}
void ProfilingBackend::head_rms_norm(Tensor& x, int head_dim, float eps) {
  timed("head_rms_norm", act(2 * bytes(x)), [&] { inner_->head_rms_norm(x, head_dim, eps); });
}
void ProfilingBackend::rope(Tensor& x, int head_dim, int rope_dim, const Tensor& positions, const RopeTable& table,
                            bool inverse) {
  // Only the rope part of each head is read and written.
  const double moved = 2 * bytes(x) * rope_dim / std::max(head_dim, 1) + bytes(positions);
  timed(inverse ? "rope (inverse)" : "rope", act(moved), [&] { inner_->rope(x, head_dim, rope_dim, positions, table, inverse); });
}
void ProfilingBackend::norm_rope(Tensor& x, int head_dim, const uint16_t* weight, float eps, int rope_dim,
                                 const Tensor& positions, const RopeTable& table, bool fp8_nope) {
  const double moved = 2 * bytes(x) + bytes(positions);
  timed("norm_rope", weights_and(2.0 * head_dim, moved),
        [&] { inner_->norm_rope(x, head_dim, weight, eps, rope_dim, positions, table, fp8_nope); });
}
void ProfilingBackend::head_norm_rope(Tensor& x, int head_dim, float eps, int rope_dim, const Tensor& positions,
                                      const RopeTable& table) {
  timed("head_norm_rope", act(2 * bytes(x) + bytes(positions)),
        [&] { inner_->head_norm_rope(x, head_dim, eps, rope_dim, positions, table); });
}
void ProfilingBackend::fp8_simulate(Tensor& x, int row_width, int channels) {
  timed("fp8_simulate", act(2 * bytes(x)), [&] { inner_->fp8_simulate(x, row_width, channels); });
}
void ProfilingBackend::hadamard_fp4_simulate(Tensor& x, int width) {
  timed("hadamard_fp4_simulate", act(2 * bytes(x)), [&] { inner_->hadamard_fp4_simulate(x, width); });
}
Tensor ProfilingBackend::add(const Tensor& a, const Tensor& b) {
  return timed("add", act(bytes(a) + bytes(b)), [&] { return inner_->add(a, b); });
}
Tensor ProfilingBackend::scale(const Tensor& x, float s) {
  return timed("scale", act(bytes(x)), [&] { return inner_->scale(x, s); });
}

Tensor ProfilingBackend::linear(const Tensor& x, const LinearWeight& w) {
  if (!on_ && !recording_) return inner_->linear(x, w);  // no label built on the unprofiled path
  return timed("linear " + weight_label(w.name), weights_and(linear_weight_bytes(w), bytes(x), 2 * rows(x) * w.out * w.in),
               [&] { return inner_->linear(x, w); });
}
std::vector<Tensor> ProfilingBackend::linears(const Tensor& x, const std::vector<const LinearWeight*>& ws) {
  if (!on_ && !recording_) return inner_->linears(x, ws);
  std::string label = ws.size() == 1 ? "linear" : "linears";  // one weight: what linear would say
  double weights = 0, out = 0, flops = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    label += (i ? " + " : " ") + weight_label(ws[i]->name);
    weights += linear_weight_bytes(*ws[i]);
    out += 2 * rows(x) * ws[i]->out;  // bf16 results
    flops += 2 * rows(x) * ws[i]->out * ws[i]->in;
  }
  return timed(label, weights_and(weights, bytes(x) + out, flops), [&] { return inner_->linears(x, ws); });
}
std::vector<Tensor> ProfilingBackend::linears_f32(const Tensor& x,
                                                  const std::vector<std::pair<const uint16_t*, int>>& ws, int in) {
  if (!on_ && !recording_) return inner_->linears_f32(x, ws, in);
  // One weight: what linear_f32 would say; several: "linears_f32 1024+1024x4096".
  std::vector<std::string> widths;
  double weights = 0, out = 0;
  for (const auto& [w, n] : ws) {
    widths.push_back(std::to_string(n));
    weights += 2.0 * n * in;
    out += 4.0 * rows(x) * n;  // f32 results
  }
  const std::string label = fmt::format("{} {}x{}", ws.size() == 1 ? "linear_f32" : "linears_f32", fmt::join(widths, "+"), in);
  return timed(label, weights_and(weights, bytes(x) + out, rows(x) * weights),
               [&] { return inner_->linears_f32(x, ws, in); });
}
Tensor ProfilingBackend::linear_bf16(const Tensor& x, const uint16_t* w, int out, int in) {
  if (!on_ && !recording_) return inner_->linear_bf16(x, w, out, in);
  return timed("linear_bf16 " + std::to_string(out) + "x" + std::to_string(in),
               weights_and(2.0 * out * in, bytes(x), 2 * rows(x) * out * in),
               [&] { return inner_->linear_bf16(x, w, out, in); });
}
Tensor ProfilingBackend::linear_f32(const Tensor& x, const uint16_t* w, int out, int in) {
  if (!on_ && !recording_) return inner_->linear_f32(x, w, out, in);
  return timed("linear_f32 " + std::to_string(out) + "x" + std::to_string(in),
               weights_and(2.0 * out * in, bytes(x), 2 * rows(x) * out * in),
               [&] { return inner_->linear_f32(x, w, out, in); });
}
Tensor ProfilingBackend::grouped_out_proj(const Tensor& o, const LinearWeight& wo_a, int groups, int rank) {
  const double in = o.rows() ? double(o.numel() / o.rows()) : 0;
  return timed("grouped_out_proj", weights_and(linear_weight_bytes(wo_a), bytes(o), 2 * rows(o) * rank * in),
               [&] { return inner_->grouped_out_proj(o, wo_a, groups, rank); });
}

// With a norm: its weight (bf16 [D]) counts among the weights.
Tensor ProfilingBackend::hc_pre(const Tensor& X, const HyperConnection& hc, int hc_mult, int iters, float norm_eps,
                                float hc_eps, Tensor* post, Tensor* comb, const uint16_t* norm) {
  const double width = double(X.numel() / std::max<int64_t>(X.rows(), 1));
  const double fn = 4.0 * (2 + hc_mult) * hc_mult * width, w = fn + (norm ? 2 * width / hc_mult : 0);
  return timed(norm ? "hc_pre + rms_norm" : "hc_pre", weights_and(w, bytes(X), rows(X) * fn / 2),
               [&] { return inner_->hc_pre(X, hc, hc_mult, iters, norm_eps, hc_eps, post, comb, norm); });
}
Tensor ProfilingBackend::hc_post_pre(const Tensor& y, const Tensor& X, Tensor* Xa, const HyperConnection& hc, int hc_mult,
                                     int iters, float norm_eps, float hc_eps, Tensor* post, Tensor* comb,
                                     const uint16_t* norm) {
  const double width = double(X.numel() / std::max<int64_t>(X.rows(), 1));
  const double fn = 4.0 * (2 + hc_mult) * hc_mult * width, w = fn + (norm ? 2 * width / hc_mult : 0);
  const double moved = bytes(y) + 2 * bytes(X) + bytes(*post) + bytes(*comb);  // X read, Xa written
  return timed(norm ? "hc_post + hc_pre + rms_norm" : "hc_post + hc_pre", weights_and(w, moved, rows(X) * fn / 2),
               [&] { return inner_->hc_post_pre(y, X, Xa, hc, hc_mult, iters, norm_eps, hc_eps, post, comb, norm); });
}
Tensor ProfilingBackend::hc_post(const Tensor& y, const Tensor& X, const Tensor& post, const Tensor& comb) {
  return timed("hc_post", act(bytes(y) + bytes(X) + bytes(post) + bytes(comb)), [&] { return inner_->hc_post(y, X, post, comb); });
}
Tensor ProfilingBackend::hc_head(const Tensor& X, const HyperConnection& hc, int hc_mult, float norm_eps, float hc_eps,
                                 const uint16_t* norm) {
  const double width = double(X.numel() / std::max<int64_t>(X.rows(), 1));
  const double fn = 4.0 * hc_mult * width, w = fn + (norm ? 2 * width / hc_mult : 0);
  return timed(norm ? "hc_head + rms_norm" : "hc_head", weights_and(w, bytes(X)),
               [&] { return inner_->hc_head(X, hc, hc_mult, norm_eps, hc_eps, norm); });
}

void ProfilingBackend::write_entries(const Tensor& values, const Tensor& entries, EntryPool& pool) {
  const double written = double(values.rows()) * entry_bytes(pool.kind);
  timed(pool.kind == EntryKind::KV ? "write_entries kv" : "write_entries index_keys",
        cache_and(written, bytes(values) + bytes(entries)), [&] { inner_->write_entries(values, entries, pool); });
}
void ProfilingBackend::copy_entries(const Tensor& src, const Tensor& dst, EntryPool& pool) {
  const double per = 2 * entry_bytes(pool.kind);
  timed("copy_entries", act(bytes(src) + bytes(dst)), [&] { inner_->copy_entries(src, dst, pool); }, [this, src, dst, per] {
    const auto s = read_i32(*inner_, src), d = read_i32(*inner_, dst);
    double n = 0;
    for (size_t i = 0; i < s.size(); ++i) n += s[i] >= 0 && d[i] >= 0;
    return cache_and(n * per, 0);
  });
}
Tensor ProfilingBackend::step_indices(const StepIndexArgs& args) {
  return timed("step_indices", act(bytes(args.window) + bytes(args.compressed)), [&] { return inner_->step_indices(args); });
}
std::vector<Tensor> ProfilingBackend::step_index_sets(const std::vector<StepIndexArgs>& sets) {
  double tables = 0;
  for (const StepIndexArgs& a : sets) tables += bytes(a.window) + bytes(a.compressed);
  return timed("step_indices", act(tables), [&] { return inner_->step_index_sets(sets); });
}
Tensor ProfilingBackend::sparse_attention(const Tensor& q, int n_heads, int head_dim, const EntryPool& kv_pool,
                                          const Tensor& entry_lists, const float* sink, float scale) {
  // Each query reads its listed entries.
  return timed("sparse_attention", act(bytes(q) + bytes(entry_lists)),
               [&] { return inner_->sparse_attention(q, n_heads, head_dim, kv_pool, entry_lists, sink, scale); },
               [this, entry_lists, n_heads, head_dim] {
                 double n = 0;
                 for (int32_t e : read_i32(*inner_, entry_lists)) n += e >= 0;
                 return cache_and(n * double(kv_layout::kEntryBytes), 0, 4.0 * n * n_heads * head_dim);
               });
}
Tensor ProfilingBackend::indexer_topk(const Tensor& q, const Tensor& head_weights, int n_heads, const EntryPool& key_pool,
                                      const KeyTables& keys, int k) {
  // Each query scores its first counts[t] keys.
  return timed("indexer_topk", act(bytes(q) + bytes(head_weights)),
               [&] { return inner_->indexer_topk(q, head_weights, n_heads, key_pool, keys, k); },
               [this, counts = keys.counts, per_key = 2.0 * double(q.numel() / std::max<int64_t>(q.rows(), 1))] {
                 double n = 0;
                 for (int32_t c : read_i32(*inner_, counts)) n += std::max(c, 0);
                 return cache_and(n * double(kv_layout::kIndexFp4EntryBytes), 0, n * per_key);
               });
}

Tensor ProfilingBackend::compressor_update(const Tensor& a, const Tensor& g, const StepTables& step, const Tensor& slots,
                                           int64_t capacity, int64_t max_span_rows, const float* ape,
                                           CompressorStates& states) {
  // Each row writes its state row (kv and score); completing an entry reads its slot's state.
  const double row_bytes = a.rows() ? 2 * bytes(a) / double(a.rows()) : 0;  // a and g
  const double slot_bytes = 2.0 * double(states.slot_floats()) * 4;
  const double state_row = slot_bytes / double((states.ratio == 4 ? 2 : 1) * states.ratio);
  const double rows = double(a.rows());
  return timed("compressor_update", cache_and(state_row * rows + slot_bytes * double(capacity), row_bytes * rows),
               [&] { return inner_->compressor_update(a, g, step, slots, capacity, max_span_rows, ape, states); });
}
Tensor ProfilingBackend::to_bf16(const Tensor& x) {
  return timed("to_bf16", act(bytes(x)), [&] { return inner_->to_bf16(x); });
}

Routing ProfilingBackend::route(const Tensor& x, const MoeWeights& w, const Tensor& token_ids, int k, float route_scale) {
  const double E = double(w.n_routed ? w.n_routed : int(w.experts.size())), D = x.rows() ? double(x.numel() / x.rows()) : 0;
  const OpCost moved = w.hash_table ? weights_and(double(token_ids.numel()) * k * 4, bytes(x) + bytes(token_ids))
                                     : weights_and(2.0 * E * D + 4 * E, bytes(x));
  return timed(w.hash_table ? "route (hash)" : "route", moved, [&] { return inner_->route(x, w, token_ids, k, route_scale); });
}
constexpr const char* kMoeExpertsOp = "moe_experts (shared + routed)";
// What the MoE moves: the shared expert, and each distinct routed expert of this rank the rows
// chose, once (counted after the step from the ids).
Tensor ProfilingBackend::timed_moe(const Tensor& x, const Routing& r, const MoeWeights& w,
                                   const std::function<Tensor()>& run) {
  if (!on_ && !recording_) return run();
  const ExpertWeights& s = w.shared;
  const double shared = linear_weight_bytes(s.w1) + linear_weight_bytes(s.w2) + linear_weight_bytes(s.w3);
  double expert = 0, expert_flops = 0;
  if (!w.experts.empty()) {
    const ExpertWeights& e = w.experts[0];
    expert = linear_weight_bytes(e.w1) + linear_weight_bytes(e.w2) + linear_weight_bytes(e.w3);
    expert_flops = 2.0 * 3 * e.w1.out * e.w1.in;  // per routed row this rank holds
  }
  const int begin = w.expert_begin, end = w.expert_begin + int(w.experts.size());
  // The expected share of the pairs that land on this rank's experts (expert parallelism).
  const double held = w.n_routed == 0 ? 1.0 : double(w.experts.size()) / double(w.n_routed);
  const double flops = 2.0 * 3 * s.w1.out * s.w1.in * rows(x) + expert_flops * double(r.ids.numel()) * held;
  return timed(kMoeExpertsOp, weights_and(shared, bytes(x) + bytes(r.ids) + bytes(r.weights), flops), run,
               [this, ids = r.ids, expert, begin, end] {
                 const auto v = read_i32(*inner_, ids);
                 std::set<int32_t> distinct;
                 for (int32_t e : v)
                   if (e >= begin && e < end) distinct.insert(e);
                 return weights_and(double(distinct.size()) * expert, 0);
               });
}

// The work begun here (the shared expert, where the backend begins it) is moe_experts' own: recorded
// under its name as a continuation, so that its time, its replayed items and its bytes (counted by
// moe_experts) stay in one row, and a backend that begins nothing adds no row of its own.
void ProfilingBackend::moe_begin(const Tensor& x, const MoeWeights& w, float swiglu_limit) {
  timed(kMoeExpertsOp, act(0), [&] { inner_->moe_begin(x, w, swiglu_limit); }, {}, true);
}
Tensor ProfilingBackend::moe_experts(const Tensor& x, const Routing& r, const MoeWeights& w, float swiglu_limit) {
  return timed_moe(x, r, w, [&] { return inner_->moe_experts(x, r, w, swiglu_limit); });
}

Tensor ProfilingBackend::moe_expert_partials(const Tensor& x, const Routing& r, const MoeWeights& w, float swiglu_limit) {
  return timed_moe(x, r, w, [&] { return inner_->moe_expert_partials(x, r, w, swiglu_limit); });
}

Tensor ProfilingBackend::moe_combine(const Tensor& partials, const Routing& r) {
  return timed("moe_combine", act(bytes(partials) + bytes(r.ids)), [&] { return inner_->moe_combine(partials, r); });
}

Tensor ProfilingBackend::linear_partial(const Tensor& x, const LinearWeight& w) {
  if (!on_ && !recording_) return inner_->linear_partial(x, w);
  return timed("linear " + weight_label(w.name), weights_and(linear_weight_bytes(w), bytes(x), 2 * rows(x) * w.out * w.in),
               [&] { return inner_->linear_partial(x, w); });
}

Tensor ProfilingBackend::logits(const Tensor& h, const uint16_t* head, int vocab) {
  const double D = h.rows() ? double(h.numel() / h.rows()) : 0;
  return timed("logits (head)", weights_and(2.0 * vocab * D, bytes(h), 2 * rows(h) * vocab * D), [&] { return inner_->logits(h, head, vocab); });
}
Tensor ProfilingBackend::sample(const Tensor& logits, const Tensor& params, const Tensor& counters) {
  return timed("sample", act(bytes(logits) + bytes(params) + bytes(counters)), [&] { return inner_->sample(logits, params, counters); });
}
void ProfilingBackend::apply_penalties(Tensor& logits, const Tensor& params, const Tensor& rows, const Tensor& ids,
                                       const Tensor& counts) {
  timed("apply_penalties", act(bytes(params) + bytes(rows) + bytes(ids) + bytes(counts) + 8.0 * double(ids.numel())),
        [&] { inner_->apply_penalties(logits, params, rows, ids, counts); });
}
LogprobRows ProfilingBackend::logprobs(const Tensor& logits, const Tensor& chosen, int top_n) {
  return timed("logprobs", act(bytes(logits) + bytes(chosen)), [&] { return inner_->logprobs(logits, chosen, top_n); });
}

}  // namespace dsv4
