// MoE on the CPU (SPEC §3.7): sqrt-softplus routing (bias for selection only, renormalise,
// × route_scale), hash routing, clamped SwiGLU experts with the routing weight applied before
// W2's activation quantisation, shared expert, f32 sum in expert-id order then the shared expert.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/moe_fp4_reference.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace dsv4 {

Routing CpuBackend::route(const Tensor& x, const MoeWeights& w, const Tensor& token_ids, int k, float route_scale) {
  const int64_t T = x.rows();
  const int E = w.n_routed ? w.n_routed : int(w.experts.size());  // expert parallelism binds only some experts
  const int D = int(x.numel() / T);
  Tensor logits = linear_f32(x, w.gate, E, D);
  Routing r{alloc(DType::I32, {T, k}), alloc(DType::F32, {T, k}), nullptr};
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> aff(static_cast<size_t>(E)), sel(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
      float z = logits.ptr<float>()[t * E + e];
      float sp = z > 20.0f ? z : std::log1p(std::exp(z));  // torch softplus, threshold 20
      aff[size_t(e)] = std::sqrt(sp);
      sel[size_t(e)] = w.bias ? aff[size_t(e)] + w.bias[e] : aff[size_t(e)];
    }
    int32_t* ids = r.ids.ptr<int32_t>() + t * k;
    if (w.hash_table) {
      for (int i = 0; i < k; ++i) ids[i] = w.hash_table[size_t(token_ids.ptr<int32_t>()[t]) * size_t(k) + size_t(i)];
    } else {
      std::vector<int> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      // Highest first; ties go to the lower expert id.
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sel[size_t(a)] > sel[size_t(b)]; });
      for (int i = 0; i < k; ++i) ids[i] = order[size_t(i)];
    }
    float* wt = r.weights.ptr<float>() + t * k;
    float sum = 0;
    for (int i = 0; i < k; ++i) sum += (wt[i] = aff[size_t(ids[i])]);
    for (int i = 0; i < k; ++i) wt[i] = wt[i] / sum * route_scale;
  }
  return r;
}

namespace {

// One SwiGLU expert's w2 input on a set of rows: bf16 [rows, I], the routing weight applied.
Tensor swiglu_hidden(CpuBackend& be, const Tensor& x, const ExpertWeights& ew, const float* row_weights, float limit) {
  Tensor g = be.linear(x, ew.w1), u = be.linear(x, ew.w3);
  const int64_t rows = x.rows(), I = g.numel() / std::max<int64_t>(rows, 1);
  Tensor h = be.alloc(DType::BF16, {rows, I});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < I; ++i) {
      float gv = bf16_to_f32(g.ptr<uint16_t>()[r * I + i]);
      float uv = bf16_to_f32(u.ptr<uint16_t>()[r * I + i]);
      if (limit > 0) {
        uv = std::clamp(uv, -limit, limit);
        gv = std::min(gv, limit);
      }
      float a = gv / (1.0f + std::exp(-gv)) * uv;
      if (row_weights) a = row_weights[r] * a;
      h.ptr<uint16_t>()[r * I + i] = f32_to_bf16(a);
    }
  return h;
}

// One SwiGLU expert on a set of rows: returns bf16 [rows, D].
Tensor run_expert(CpuBackend& be, const Tensor& x, const ExpertWeights& ew, const float* row_weights, float limit) {
  return be.linear(swiglu_hidden(be, x, ew, row_weights, limit), ew.w2);
}

MoeFp4Shape fp4_shape(const MoeWeights& w, int64_t D, float swiglu_limit) {
  const WeightFormat f = w.experts.front().w1.format;
  return {f == WeightFormat::MXFP4 ? MoeFp4Format::Mxfp4 : MoeFp4Format::Nvfp4, int(w.experts.size()), int(D),
          w.experts.front().w1.out, swiglu_limit};
}

std::vector<MoeFp4ExpertTensors> fp4_tensors(const MoeWeights& w) {
  std::vector<MoeFp4ExpertTensors> tensors;
  for (const auto& e : w.experts)
    tensors.push_back({e.w1.w, e.w1.scale, e.w3.w, e.w3.scale, e.w2.w, e.w2.scale, e.w1.scale2, e.w3.scale2, e.w2.scale2});
  return tensors;
}

bool fp4_experts(const MoeWeights& w) {
  const WeightFormat f = w.experts.front().w1.format;
  return f == WeightFormat::MXFP4 || f == WeightFormat::NVFP4;
}

}  // namespace

Tensor CpuBackend::moe_experts(const Tensor& x, const Routing& r, const MoeWeights& w, float swiglu_limit) {
  const int64_t T = x.rows(), D = x.numel() / T;
  const int k = int(r.ids.numel() / T);
  Tensor ys = run_expert(*this, x, w.shared, nullptr, swiglu_limit);
  Tensor out = alloc(DType::BF16, {T, D});
  if (fp4_experts(w)) {
    // FP4 experts: the CPU twin of the CUDA MoE with the reference's FP8-activation numerics.
    cpu::moe_fp4_reference(fp4_shape(w, D, swiglu_limit), fp4_tensors(w), x.ptr<uint16_t>(), int(T), r.ids.ptr<int32_t>(),
                           r.weights.ptr<float>(), k, ys.ptr<uint16_t>(), out.ptr<uint16_t>(), MoeActivationNumerics::Fp8);
    return out;
  }
  // BF16 / FP8 experts: each expert over the rows routed to it, summed in expert-id order.
  std::vector<float> acc(size_t(T * D), 0.0f);
  for (int e = 0; e < int(w.experts.size()); ++e) {
    std::vector<int64_t> rows;
    std::vector<float> weights;
    for (int64_t t = 0; t < T; ++t)
      for (int i = 0; i < k; ++i)
        if (r.ids.ptr<int32_t>()[t * k + i] == e) {
          rows.push_back(t);
          weights.push_back(r.weights.ptr<float>()[t * k + i]);
        }
    if (rows.empty()) continue;
    Tensor xe = alloc(DType::BF16, {int64_t(rows.size()), D});
    for (size_t j = 0; j < rows.size(); ++j) copy_rows(x, rows[j], xe, int64_t(j), 1);
    Tensor ye = run_expert(*this, xe, w.experts[size_t(e)], weights.data(), swiglu_limit);
    for (size_t j = 0; j < rows.size(); ++j)
      for (int64_t d = 0; d < D; ++d) acc[size_t(rows[j] * D + d)] += bf16_to_f32(ye.ptr<uint16_t>()[int64_t(j) * D + d]);
  }
  for (int64_t i = 0; i < T * D; ++i)
    out.ptr<uint16_t>()[i] = f32_to_bf16(acc[size_t(i)] + bf16_to_f32(ys.ptr<uint16_t>()[i]));
  return out;
}

Tensor CpuBackend::moe_expert_partials(const Tensor& x, const Routing& r, const MoeWeights& w, float swiglu_limit) {
  const int64_t T = x.rows(), D = x.numel() / T;
  const int k = int(r.ids.numel() / T), slots = k + 1;
  Tensor out = alloc(DType::F32, {T, slots, D});
  std::fill_n(out.ptr<float>(), out.numel(), 0.0f);
  // The shared expert's partial (its intermediate is split like a TP expert's) in slot k.
  Tensor ys = linear_partial(swiglu_hidden(*this, x, w.shared, nullptr, swiglu_limit), w.shared.w2);
  for (int64_t t = 0; t < T; ++t) std::copy_n(ys.ptr<float>() + t * D, D, out.ptr<float>() + (t * slots + k) * D);
  // Pairs of the experts this rank holds, by local index; the others stay 0.
  const int local = int(w.experts.size());
  std::vector<int32_t> ids(size_t(T * k));
  for (size_t p = 0; p < ids.size(); ++p) {
    const int32_t e = r.ids.ptr<int32_t>()[p] - w.expert_begin;
    ids[p] = e >= 0 && e < local ? e : -1;
  }
  if (fp4_experts(w)) {
    cpu::moe_fp4_pair_outputs(fp4_shape(w, D, swiglu_limit), fp4_tensors(w), x.ptr<uint16_t>(), int(T), ids.data(),
                              r.weights.ptr<float>(), k, out.ptr<float>(), int64_t(slots) * D, MoeActivationNumerics::Fp8);
    return out;
  }
  for (int e = 0; e < local; ++e) {
    std::vector<int64_t> pairs;  // t · k + j
    std::vector<float> weights;
    for (int64_t p = 0; p < T * k; ++p)
      if (ids[size_t(p)] == e) pairs.push_back(p), weights.push_back(r.weights.ptr<float>()[p]);
    if (pairs.empty()) continue;
    Tensor xe = alloc(DType::BF16, {int64_t(pairs.size()), D});
    for (size_t i = 0; i < pairs.size(); ++i) copy_rows(x, pairs[i] / k, xe, int64_t(i), 1);
    Tensor ye = linear_partial(swiglu_hidden(*this, xe, w.experts[size_t(e)], weights.data(), swiglu_limit), w.experts[size_t(e)].w2);
    for (size_t i = 0; i < pairs.size(); ++i) {
      const int64_t t = pairs[i] / k, j = pairs[i] % k;
      std::copy_n(ye.ptr<float>() + int64_t(i) * D, D, out.ptr<float>() + (t * slots + j) * D);
    }
  }
  return out;
}

Tensor CpuBackend::moe_combine(const Tensor& partials, const Routing& r) {
  const int64_t T = r.ids.rows();
  const int k = int(r.ids.numel() / std::max<int64_t>(T, 1)), slots = k + 1;
  const int64_t D = T ? partials.numel() / (T * slots) : 0;
  DSV4_CHECK(partials.dtype == DType::F32 && partials.numel() == T * slots * D, "moe_combine: {} partials for {} rows of {} slots",
             partials.numel(), T, slots);
  Tensor out = alloc(DType::BF16, {T, D});
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    std::vector<int> order(static_cast<size_t>(k));
    for (int64_t t = t0; t < t1; ++t) {
      const int32_t* ids = r.ids.ptr<int32_t>() + t * k;
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return ids[a] < ids[b]; });
      const float* p = partials.ptr<float>() + t * slots * D;
      for (int64_t c = 0; c < D; ++c) {
        float sum = 0.0f;  // moe_experts' accumulation: experts in id order, each rounded as its output is
        for (int j : order)
          if (ids[j] >= 0) sum += round_bf16(p[int64_t(j) * D + c]);
        out.ptr<uint16_t>()[t * D + c] = f32_to_bf16(sum + round_bf16(p[int64_t(k) * D + c]));
      }
    }
  });
  return out;
}

}  // namespace dsv4
