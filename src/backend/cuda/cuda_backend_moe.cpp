// CUDA backend: routing and the MoE (SPEC §3.7). Routed experts in MXFP4 or NVFP4 are repacked at
// load, on the GPU, into the FP4 kernels' layout (moe_fp4.h, moe_fp4_repack.h); the shared expert
// runs on the FP8 linears.
#include <algorithm>
#include <bit>
#include <cstdlib>
#include <string>

#include "backend/cuda/act_quant_fp8.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/moe_fp4.h"
#include "backend/cuda/moe_fp4_repack.h"
#include "backend/cuda/router.h"
#include "backend/cuda/row_ops.h"
#include "backend/cuda/sparse_mla_decode.h"
#include "core/error.h"
#include "core/log.h"

namespace dsv4::cuda {

namespace {
// MoeWeights::prepared on this backend.
struct PreparedExperts {
  explicit PreparedExperts(MoeFp4Weights w) : weights(std::move(w)) {}
  MoeFp4Weights weights;
};
}  // namespace

void CudaBackend::prepare_experts(MoeWeights& w, float swiglu_limit) {
  if (w.experts.empty()) return;
  const LinearWeight& w1 = w.experts.front().w1;
  if (w1.format != WeightFormat::MXFP4 && w1.format != WeightFormat::NVFP4)
    fail("{}: the CUDA backend runs routed experts in MXFP4 or NVFP4; this checkpoint's are {} (use --backend cpu)",
         w1.name, weight_format_name(w1.format));
  MoeFp4Shape shape{w1.format == WeightFormat::MXFP4 ? MoeFp4Format::Mxfp4 : MoeFp4Format::Nvfp4, int(w.experts.size()),
                    w1.in, w1.out, swiglu_limit};
  std::vector<MoeFp4ExpertTensors> tensors;
  for (const auto& e : w.experts)
    tensors.push_back({e.w1.w, e.w1.scale, e.w3.w, e.w3.scale, e.w2.w, e.w2.scale, e.w1.scale2, e.w3.scale2, e.w2.scale2});
  // The on-disk bytes go up as they are (one copy per tensor, through a staging of at most
  // kMoeRepackStagingBytes that is freed before the next layer) and are repacked on the device.
  MoeFp4Weights weights = MoeFp4Weights::allocate(shape);
  const size_t rounded = moe_fp4_repack_device(tensors, weights, stream());
  if (rounded)
    log_info("  {}: {} MXFP4 scale groups lie more than 2^14 below their row's largest: rounded to e4m3 in the W4A8 form",
             w1.name, rounded);
  w.prepared = std::make_shared<PreparedExperts>(std::move(weights));
  if (!logged_paths_) {
    logged_paths_ = true;
    const bool w4a8 = moe_fp4_path_available(MoeFp4Path::W4A8, shape);
    log_info("  routed experts ({}) on this GPU, activations on the FP8 grid (SPEC §2.2): {}", w1.format == WeightFormat::MXFP4 ? "MXFP4" : "NVFP4",
             moe_path_override_ >= 0
                 ? fmt::format("{} (forced by DSV4_MOE_PATH)", moe_fp4_path_name(MoeFp4Path(moe_path_override_)))
             : w4a8 ? std::string("W4A16 decode up to 16 pairs per expert, W4A8 wgmma above")
                    : std::string("W4A16 decode up to 20 pairs per expert, W4A16 batched above"));
    log_info("  FP8 block linears (e4m3 activations per 128) and bf16-weight linears, head and gate: {}; "
             "attention: sparse MLA, {}",
             linear_paths(),
             attention_paths());
  }
}

std::string CudaBackend::attention_paths() const {
  const char* e = std::getenv("DSV4_ATTN_SPLIT");
  const std::string v = e ? e : "";
  if (v == "1") return "mma.sync split-KV at every list, each piece from the running maximum before it (DSV4_ATTN_SPLIT=1)";
  if (v == "0") return "mma.sync, one CTA per query and head group, 64-entry softmax blocks (DSV4_ATTN_SPLIT=0)";
  if (v == "plain")
    return sparse_mla_wgmma_available() ? "split-KV, pieces from their own maximum (DSV4_ATTN_SPLIT=plain; wgmma from 2 queries)"
                                        : "split-KV, pieces from their own maximum (DSV4_ATTN_SPLIT=plain), mma.sync";
  return "mma.sync, 64-entry softmax blocks; lists over 256 entries at up to 16 queries split-KV, each piece from the "
         "running maximum before it (a max pass first), else one CTA per query and head group";
}

MoeWorkspace& CudaBackend::moe_workspace(const MoeFp4Shape& shape, int tokens, int k) {
  auto& ws = moe_ws_[{int(shape.format), shape.experts, shape.hidden, shape.inter, k}];
  if (!ws || ws->max_tokens() < tokens) {
    stream_.sync();  // the old scratch may still be in use by queued work
    ws = std::make_unique<MoeWorkspace>(shape, int(std::bit_ceil(unsigned(std::max(tokens, 16)))), k);
    ws_grouping_[ws.get()] = ++groupings_;  // (a handle of the one it replaces, at its address, is stale)
    ++epoch_;
  }
  return *ws;
}

namespace {
// Routing::prepared on this backend: the pairs are grouped in `ws` as `path` reads them, by the
// backend's grouping number `grouping` (a later grouping into ws makes the handle stale).
struct GroupedPairs {
  const MoeWorkspace* ws;
  MoeFp4Path path;
  uint64_t grouping;
};
}  // namespace

bool CudaBackend::pairs_grouped(const Routing& r, const MoeWorkspace& ws, MoeFp4Path path) const {
  const auto* g = static_cast<const GroupedPairs*>(r.prepared.get());
  const auto at = ws_grouping_.find(&ws);
  return g && g->ws == &ws && g->path == path && at != ws_grouping_.end() && g->grouping == at->second;
}

Routing CudaBackend::route(const Tensor& x, const MoeWeights& w, const Tensor& token_ids, int k, float route_scale) {
  const int64_t T = x.rows();
  const int E = w.n_routed ? w.n_routed : int(w.experts.size());  // expert parallelism binds only some experts
  const int D = int(x.numel() / std::max<int64_t>(T, 1));
  Tensor logits = linear_f32(x, w.gate, E, D);
  Routing r{alloc(DType::I32, {T, k}), alloc(DType::F32, {T, k}), nullptr};
  if (!T) return r;
  DSV4_CHECK(!w.hash_table || token_ids.numel() == T, "route: {} token ids for {} rows", token_ids.numel(), T);
  const int32_t* ids_in = w.hash_table ? token_ids.ptr<int32_t>() : nullptr;
  // A decode step's few tokens: the pairs grouped for the MoE kernels in the router's launch (one
  // dependent launch fewer), where this rank holds every expert (the grouping is by global id).
  if (one_launch_ && w.prepared && T <= kFusedRouteTokens && int(w.experts.size()) == E && w.expert_begin == 0) {
    const MoeFp4Shape& shape = static_cast<const PreparedExperts*>(w.prepared.get())->weights.shape();
    const MoeFp4Path path = moe_path(shape, int(T), k);
    MoeWorkspace& ws = moe_workspace(shape, int(T), k);
    if (moe_route_topk_pairs(logits.ptr<float>(), w.bias, w.hash_table, ids_in, int(T), E, k, route_scale,
                             r.ids.ptr<int32_t>(), r.weights.ptr<float>(), shape.experts,
                             path == MoeFp4Path::W4A16Stream, ws, stream())) {
      r.prepared = std::make_shared<GroupedPairs>(GroupedPairs{&ws, path, ws_grouping_[&ws] = ++groupings_});
      return r;
    }
  }
  route_topk(logits.ptr<float>(), w.bias, w.hash_table, ids_in, T, E, k, route_scale, r.ids.ptr<int32_t>(),
             r.weights.ptr<float>(), stream());
  return r;
}

CudaBackend::MoeInput CudaBackend::quantise_moe_input(const Tensor& x, bool values) {
  const int64_t T = x.rows(), D = x.numel() / std::max<int64_t>(T, 1);
  MoeInput in;
  if (!T || D % 128) return in;
  if (const QuantCompanion* c = quant_companion(x, D); c && (!values || c->values.data)) {
    in = *c;  // quantised by the op that wrote x (the hyper-connections' normed x_in)
    if (!values) in.values = {};
    return in;
  }
  in.q = alloc(DType::U8, {T, D});
  in.s = alloc(DType::F32, {T, D / 128});
  if (values) in.values = alloc(DType::BF16, {T, D});
  act_quant_fp8(x.ptr<uint16_t>(), int(T), int(D), in.q.ptr<uint8_t>(), in.s.ptr<float>(),
                values ? in.values.ptr<uint16_t>() : nullptr, stream());
  return in;
}

Tensor CudaBackend::shared_expert(const Tensor& x, const MoeInput& in, const ExpertWeights& shared, float swiglu_limit,
                                  bool f32, std::vector<Tensor>* keep) {
  const int64_t T = x.rows();
  const int I = shared.w1.out;
  const auto fp8 = [&](const LinearWeight& w) { return w.format == WeightFormat::FP8_BLOCK && w.in % 128 == 0; };
  if (!in.q.data || !fp8(shared.w1) || !fp8(shared.w3) || !fp8(shared.w2) || shared.w1.in != shared.w3.in ||
      shared.w3.out != I || shared.w2.in != I) {
    const std::vector<Tensor> gu = linears(x, {&shared.w1, &shared.w3});
    Tensor h = alloc(DType::BF16, {T, I});
    swiglu(gu[0].ptr<uint16_t>(), gu[1].ptr<uint16_t>(), T, I, swiglu_limit, nullptr, h.ptr<uint16_t>(), stream());
    if (keep) keep->insert(keep->end(), {gu[0], gu[1], h});
    return f32 ? linear_partial(h, shared.w2) : linear(h, shared.w2);
  }
  std::vector<Tensor> gu = {alloc(DType::BF16, {T, I}), alloc(DType::BF16, {T, I})};
  fp8_linears_quantised(in.q, in.s, {&shared.w1, &shared.w3}, false, gu);
  Tensor hq = alloc(DType::U8, {T, I}), hs = alloc(DType::F32, {T, I / 128});
  swiglu_act_quant_fp8(gu[0].ptr<uint16_t>(), gu[1].ptr<uint16_t>(), int(T), I, swiglu_limit, hq.ptr<uint8_t>(),
                       hs.ptr<float>(), stream());
  std::vector<Tensor> y = {alloc(f32 ? DType::F32 : DType::BF16, {T, shared.w2.out})};
  fp8_linears_quantised(hq, hs, {&shared.w2}, f32, y);
  if (keep) keep->insert(keep->end(), {gu[0], gu[1], hq, hs});
  return y[0];
}

Tensor CudaBackend::shared_expert_beside(const Tensor& x, const MoeInput& in, const ExpertWeights& shared,
                                         float swiglu_limit, bool f32, std::vector<Tensor>& keep) {
  if (x.rows() > shared_branch_rows_) return shared_expert(x, in, shared, swiglu_limit, f32);
  fork_side();
  Tensor ys = shared_expert(x, in, shared, swiglu_limit, f32, &keep);
  unfork_side();
  return ys;
}

namespace {
const MoeFp4Weights& prepared_weights(const MoeWeights& w) {
  const auto* prepared = static_cast<const PreparedExperts*>(w.prepared.get());
  DSV4_CHECK(prepared, "moe_experts: the routed experts were not prepared for the CUDA backend");
  return prepared->weights;
}
}  // namespace

MoeFp4Path CudaBackend::moe_path(const MoeFp4Shape& shape, int tokens, int k) const {
  if (moe_path_override_ >= 0 && moe_fp4_path_available(MoeFp4Path(moe_path_override_), shape))
    return MoeFp4Path(moe_path_override_);
  return moe_fp4_select_path(shape, tokens, k);
}

// For a decode step's rows the shared expert needs only x, which exists before the router runs: on
// the branch from here it streams its weights while the gate and the top-k (latency-bound, HBM idle)
// run on the stream, instead of beside the routed experts only (docs/perf/2026-12-05-producer-codes.md).
void CudaBackend::moe_begin(const Tensor& x, const MoeWeights& w, float swiglu_limit) {
  drop_shared_ahead();
  const int64_t T = x.rows(), D = x.numel() / std::max<int64_t>(T, 1);
  if (!T || T > shared_branch_rows_ || D % 128 || !w.prepared) return;
  auto ahead = std::make_unique<SharedAhead>();
  ahead->in = quantise_moe_input(x, true);  // (values: whichever path the routed experts take)
  ahead->x = x.data, ahead->w = &w, ahead->swiglu_limit = swiglu_limit;
  fork_side();
  ahead->y = shared_expert(x, ahead->in, w.shared, swiglu_limit, false, &ahead->keep);
  unfork_side();
  shared_ahead_ = std::move(ahead);
}

void CudaBackend::drop_shared_ahead() {
  if (!shared_ahead_) return;
  join_side();
  shared_ahead_.reset();
}

std::unique_ptr<CudaBackend::SharedAhead> CudaBackend::take_shared_ahead(const Tensor& x, const MoeWeights& w,
                                                                         float swiglu_limit, bool values) {
  std::unique_ptr<SharedAhead> ahead = std::move(shared_ahead_);
  if (!ahead) return nullptr;
  if (ahead->x == x.data && ahead->w == &w && ahead->swiglu_limit == swiglu_limit && (!values || ahead->in.values.data))
    return ahead;
  join_side();  // another x: its tensors go once the branch has run
  return nullptr;
}

Tensor CudaBackend::moe_experts(const Tensor& x, const Routing& r, const MoeWeights& w, float swiglu_limit) {
  const int64_t T = x.rows(), D = x.numel() / std::max<int64_t>(T, 1);
  Tensor out = alloc(DType::BF16, {T, D});
  if (!T) return out;
  const int k = int(r.ids.numel() / T);
  const MoeFp4Weights& mw = prepared_weights(w);
  const MoeFp4Path path = moe_path(mw.shape(), int(T), k);
  // The shared expert begun beside the router (moe_begin), with x's codes; else both made here.
  const std::unique_ptr<SharedAhead> ahead = take_shared_ahead(x, w, swiglu_limit, path != MoeFp4Path::W4A8);
  // x quantised once: the shared expert's FP8 input, and (W4A16 paths) the routed experts' FP8-grid x.
  const MoeInput in = ahead ? ahead->in : quantise_moe_input(x, path != MoeFp4Path::W4A8);
  MoeWorkspace& ws = moe_workspace(mw.shape(), int(T), k);  // (grows outside the branch: it synchronises)
  // Shared expert (SPEC §3.7): the routed experts' SwiGLU on the FP8 linears, no routing weight;
  // beside the routed experts, joined before the combine adds it.
  std::vector<Tensor> keep;
  Tensor ys = ahead ? ahead->y : shared_expert_beside(x, in, w.shared, swiglu_limit, false, keep);
  const uint16_t* x_fp8 = in.values.data ? in.values.ptr<uint16_t>() : nullptr;
  const bool grouped = pairs_grouped(r, ws, path);
  if (!grouped) ws_grouping_[&ws] = ++groupings_;  // (moe_fp4_experts groups into ws)
  moe_fp4_experts(path, mw, x.ptr<uint16_t>(), x_fp8, int(T), r.ids.ptr<int32_t>(), r.weights.ptr<float>(), k, nullptr,
                  ws, stream(), MoeActivationNumerics::Fp8, grouped);
  join_side();
  cuda::moe_combine(ws.expert_out.get(), r.ids.ptr<int32_t>(), int(T), k, mw.shape().experts, mw.shape().hidden,
                    ys.ptr<uint16_t>(), out.ptr<uint16_t>(), stream());
  return out;
}

Tensor CudaBackend::moe_expert_partials(const Tensor& x, const Routing& r, const MoeWeights& w, float swiglu_limit) {
  const int64_t T = x.rows(), D = x.numel() / std::max<int64_t>(T, 1);
  const int k = T ? int(r.ids.numel() / T) : 0;
  Tensor out = alloc(DType::F32, {T, k + 1, D});
  if (!T) return out;
  const MoeFp4Weights& mw = prepared_weights(w);
  const MoeFp4Path path = moe_path(mw.shape(), int(T), k);
  const int local = mw.shape().experts;
  drop_shared_ahead();  // (the split model does not begin one)
  // Expert parallelism: the pairs of experts this rank holds, by local index (the others → −1).
  Tensor local_ids = r.ids;
  if (w.expert_begin != 0 || (w.n_routed && local != w.n_routed)) {
    local_ids = alloc(DType::I32, {T, k});
    moe_local_expert_ids(r.ids.ptr<int32_t>(), T * k, w.expert_begin, local, local_ids.ptr<int32_t>(), stream());
  }
  const MoeInput in = quantise_moe_input(x, path != MoeFp4Path::W4A8);
  MoeWorkspace& ws = moe_workspace(mw.shape(), int(T), k);
  // The shared expert's intermediate is split like a tensor-parallel expert's: its w2 partial.
  // (Nothing is allocated from here to the join but by the branch, which keeps its scratch.)
  std::vector<Tensor> keep;
  Tensor ys = shared_expert_beside(x, in, w.shared, swiglu_limit, true, keep);
  const uint16_t* x_fp8 = in.values.data ? in.values.ptr<uint16_t>() : nullptr;
  const bool grouped = local_ids.data == r.ids.data && pairs_grouped(r, ws, path);
  if (!grouped) ws_grouping_[&ws] = ++groupings_;  // (moe_fp4_experts groups into ws)
  moe_fp4_experts(path, mw, x.ptr<uint16_t>(), x_fp8, int(T), local_ids.ptr<int32_t>(), r.weights.ptr<float>(), k,
                  out.ptr<float>(), ws, stream(), MoeActivationNumerics::Fp8, grouped);
  join_side();
  moe_partials_finish(local_ids.ptr<int32_t>(), int(T), k, local, mw.shape().hidden, ys.ptr<float>(), out.ptr<float>(),
                      stream());
  return out;
}

Tensor CudaBackend::moe_combine(const Tensor& partials, const Routing& r) {
  const int64_t T = r.ids.rows();
  const int k = int(r.ids.numel() / std::max<int64_t>(T, 1));
  const int64_t D = T ? partials.numel() / (T * (k + 1)) : 0;
  DSV4_CHECK(partials.dtype == DType::F32 && partials.numel() == T * (k + 1) * D,
             "moe_combine: {} partials for {} rows of {} slots", partials.numel(), T, k + 1);
  Tensor out = alloc(DType::BF16, {T, D});
  moe_combine_partials(partials.ptr<float>(), r.ids.ptr<int32_t>(), int(T), k, int(D), out.ptr<uint16_t>(), stream());
  return out;
}

}  // namespace dsv4::cuda
