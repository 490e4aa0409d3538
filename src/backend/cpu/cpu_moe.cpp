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
  const int E = int(w.experts.size());
  const int D = int(x.numel() / T);
  Tensor logits = linear_f32(x, w.gate, E, D);
  Routing r{alloc(DType::I32, {T, k}), alloc(DType::F32, {T, k})};
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

// One SwiGLU expert on a set of rows: returns bf16 [rows, D].
Tensor run_expert(CpuBackend& be, const Tensor& x, const ExpertWeights& ew, const float* row_weights, float limit) {
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
  return be.linear(h, ew.w2);
}

}  // namespace

Tensor CpuBackend::moe_experts(const Tensor& x, const Routing& r, const MoeWeights& w, float swiglu_limit) {
  const int64_t T = x.rows(), D = x.numel() / T;
  const int k = int(r.ids.numel() / T);
  Tensor ys = run_expert(*this, x, w.shared, nullptr, swiglu_limit);
  Tensor out = alloc(DType::BF16, {T, D});
  const WeightFormat f = w.experts.front().w1.format;
  if (f == WeightFormat::MXFP4 || f == WeightFormat::NVFP4) {
    // FP4 experts: the CPU twin of the CUDA MoE with the reference's FP8-activation numerics.
    MoeFp4Shape shape{f == WeightFormat::MXFP4 ? MoeFp4Format::Mxfp4 : MoeFp4Format::Nvfp4, int(w.experts.size()), int(D),
                      w.experts.front().w1.out, swiglu_limit};
    std::vector<MoeFp4ExpertTensors> tensors;
    for (const auto& e : w.experts)
      tensors.push_back({e.w1.w, e.w1.scale, e.w3.w, e.w3.scale, e.w2.w, e.w2.scale, e.w1.scale2, e.w3.scale2, e.w2.scale2});
    cpu::moe_fp4_reference(shape, tensors, x.ptr<uint16_t>(), int(T), r.ids.ptr<int32_t>(), r.weights.ptr<float>(), k,
                           ys.ptr<uint16_t>(), out.ptr<uint16_t>(), MoeActivationNumerics::Fp8);
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

}  // namespace dsv4
