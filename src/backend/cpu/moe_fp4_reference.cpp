#include "backend/cpu/moe_fp4_reference.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "core/dtypes.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace dsv4::cpu {
namespace {

float decode_scale(MoeFp4Format format, uint8_t code) {
  return format == MoeFp4Format::Mxfp4 ? e8m0_to_f32(code) : e4m3_to_f32(code);
}

uint8_t nibble(const uint8_t* packed, int cols, int r, int c) {
  uint8_t b = packed[size_t(r) * (cols / 2) + c / 2];
  return (c & 1) ? uint8_t(b >> 4) : uint8_t(b & 15);
}

// One FP4 matrix split into its e2m1 values and its per-group f32 scales (scale_2 folded in), so
// both numerics can be formed from it.
struct SplitMatrix {
  int rows = 0, cols = 0, group = 0;
  std::vector<float> e2m1;         // [rows, cols]
  std::vector<float> group_scale;  // [rows, cols/group]
  std::vector<float> dequant;      // [rows, cols] = e2m1 · scale (· scale_2), as dequantize_fp4_matrix
  // (dequant is filled for Bf16 numerics, e2m1 and group_scale for Fp8)
};

SplitMatrix split_matrix(MoeFp4Format format, const uint8_t* packed, const uint8_t* scales, float scale_2,
                         int rows, int cols, MoeActivationNumerics numerics) {
  SplitMatrix m;
  m.rows = rows, m.cols = cols, m.group = moe_fp4_group_size(format);
  if (numerics == MoeActivationNumerics::Bf16) {
    m.dequant = dequantize_fp4_matrix(format, packed, scales, scale_2, rows, cols);
    return m;
  }
  m.e2m1.resize(size_t(rows) * cols);
  m.group_scale.resize(size_t(rows) * (cols / m.group));
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) m.e2m1[size_t(r) * cols + c] = e2m1_to_f32(nibble(packed, cols, r, c));
    for (int g = 0; g < cols / m.group; ++g) {
      float s = decode_scale(format, scales[size_t(r) * (cols / m.group) + g]);
      m.group_scale[size_t(r) * (cols / m.group) + g] = format == MoeFp4Format::Nvfp4 ? s * scale_2 : s;
    }
  }
  return m;
}

struct ExpertMatrices {
  SplitMatrix w1, w3, w2;
};

// §2.2 act_quant, block 128: q (as f32 values of e4m3 codes) and one power-of-two scale per block.
void act_quant_fp8(const float* x, int n, std::vector<float>& q, std::vector<float>& scale) {
  q.resize(n);
  scale.resize(n / 128);
  for (int b = 0; b < n / 128; ++b) {
    float amax = 0.f;
    for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(x[b * 128 + i]));
    amax = std::max(amax, 1e-4f);
    float s = pow2_ceil(amax * (1.0f / 448.0f));
    scale[b] = s;
    for (int i = 0; i < 128; ++i) {
      float v = std::clamp(x[b * 128 + i] / s, -448.f, 448.f);
      q[b * 128 + i] = e4m3_to_f32(f32_to_e4m3(v));
    }
  }
}

// y[n] = x · W[n]ᵀ in f32, with the chosen activation numerics; x is already bf16-valued.
void fp4_linear(const SplitMatrix& w, const std::vector<float>& x, MoeActivationNumerics numerics,
                std::vector<float>& y) {
  y.assign(w.rows, 0.f);
  if (numerics == MoeActivationNumerics::Bf16) {
    for (int r = 0; r < w.rows; ++r) {
      const float* wr = &w.dequant[size_t(r) * w.cols];
      float acc = 0.f;
      for (int c = 0; c < w.cols; ++c) acc += x[c] * wr[c];
      y[r] = acc;
    }
    return;
  }
  std::vector<float> q, sx;
  act_quant_fp8(x.data(), w.cols, q, sx);
  const int groups = w.cols / w.group;
  for (int r = 0; r < w.rows; ++r) {
    const float* er = &w.e2m1[size_t(r) * w.cols];
    float acc = 0.f;
    for (int g = 0; g < groups; ++g) {
      float part = 0.f;  // exact or nearly: products of e4m3 and e2m1 values
      for (int c = g * w.group; c < (g + 1) * w.group; ++c) part += q[c] * er[c];
      acc += part * (sx[(g * w.group) / 128] * w.group_scale[size_t(r) * groups + g]);
    }
    y[r] = acc;
  }
}

}  // namespace

std::vector<float> dequantize_fp4_matrix(MoeFp4Format format, const uint8_t* packed, const uint8_t* scales,
                                         float scale_2, int rows, int cols) {
  const int group = moe_fp4_group_size(format);
  std::vector<float> w(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      float v = e2m1_to_f32(nibble(packed, cols, r, c)) * decode_scale(format, scales[size_t(r) * (cols / group) + c / group]);
      w[size_t(r) * cols + c] = format == MoeFp4Format::Nvfp4 ? v * scale_2 : v;
    }
  return w;
}

namespace {

// The experts the pairs touch, split once (ids outside [0, experts) are skipped).
std::map<int, ExpertMatrices> split_used_experts(const MoeFp4Shape& shape, const std::vector<MoeFp4ExpertTensors>& experts,
                                                 const int32_t* topk_ids, int pairs, MoeActivationNumerics numerics) {
  const int D = shape.hidden, I = shape.inter, E = shape.experts;
  if (int(experts.size()) != E) fail("moe_fp4_reference: {} expert tensors for {} experts", experts.size(), E);
  if (D % 128 || I % 128) fail("moe_fp4_reference: hidden {} and inter {} must be multiples of 128", D, I);
  std::map<int, ExpertMatrices> used;
  for (int p = 0; p < pairs; ++p) {
    int e = topk_ids[p];
    if (e < 0 || e >= E || used.count(e)) continue;
    const MoeFp4ExpertTensors& t = experts[e];
    used[e] = ExpertMatrices{split_matrix(shape.format, t.w1, t.w1_scale, t.w1_scale_2, I, D, numerics),
                             split_matrix(shape.format, t.w3, t.w3_scale, t.w3_scale_2, I, D, numerics),
                             split_matrix(shape.format, t.w2, t.w2_scale, t.w2_scale_2, D, I, numerics)};
  }
  return used;
}

// w2's f32 output for one pair (before its bf16 rounding) into y; h receives (or, with
// hidden_in, supplies) the w2 input: the clamped SwiGLU times the routing weight, bf16-valued.
void pair_output(const ExpertMatrices& m, const std::vector<float>& xf, float weight, float limit, MoeActivationNumerics numerics,
                 const uint16_t* hidden_in, std::vector<float>& g, std::vector<float>& u, std::vector<float>& h,
                 std::vector<float>& y) {
  const int I = m.w1.rows;
  if (hidden_in) {
    for (int i = 0; i < I; ++i) h[i] = bf16_to_f32(hidden_in[i]);
  } else {
    fp4_linear(m.w1, xf, numerics, g);
    fp4_linear(m.w3, xf, numerics, u);
    for (int i = 0; i < I; ++i) {
      float gi = std::min(round_bf16(g[i]), limit);
      float ui = std::clamp(round_bf16(u[i]), -limit, limit);
      float silu = gi / (1.f + std::exp(-gi));
      h[i] = round_bf16(silu * ui * weight);
    }
  }
  fp4_linear(m.w2, h, numerics, y);
}

}  // namespace

void moe_fp4_reference(const MoeFp4Shape& shape, const std::vector<MoeFp4ExpertTensors>& experts,
                       const uint16_t* x, int tokens, const int32_t* topk_ids, const float* topk_weights, int k,
                       const uint16_t* shared_or_null, uint16_t* out, MoeActivationNumerics numerics,
                       MoeHiddenTap hidden) {
  const int D = shape.hidden, I = shape.inter, E = shape.experts;
  const std::map<int, ExpertMatrices> used = split_used_experts(shape, experts, topk_ids, tokens * k, numerics);
  parallel_for(tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> xf(D), g, u, h(I), y, sum(D);
    for (int64_t t = begin; t < end; ++t) {
      for (int c = 0; c < D; ++c) xf[c] = bf16_to_f32(x[t * D + c]);
      // §3.7: experts summed in order of id, then the shared expert.
      std::vector<int> order(k);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return topk_ids[t * k + a] < topk_ids[t * k + b]; });
      std::fill(sum.begin(), sum.end(), 0.f);
      for (int j : order) {
        int e = topk_ids[t * k + j];
        if (e < 0 || e >= E) continue;
        const size_t row = (size_t(t) * k + j) * I;
        pair_output(used.at(e), xf, topk_weights[t * k + j], shape.swiglu_limit, numerics, hidden.in ? hidden.in + row : nullptr,
                    g, u, h, y);
        if (hidden.out)
          for (int i = 0; i < I; ++i) hidden.out[row + i] = f32_to_bf16(h[i]);
        for (int c = 0; c < D; ++c) sum[c] += round_bf16(y[c]);
      }
      for (int c = 0; c < D; ++c) {
        float s = sum[c] + (shared_or_null ? bf16_to_f32(shared_or_null[t * D + c]) : 0.f);
        out[t * D + c] = f32_to_bf16(s);
      }
    }
  });
}

void moe_fp4_pair_outputs(const MoeFp4Shape& shape, const std::vector<MoeFp4ExpertTensors>& experts, const uint16_t* x,
                          int tokens, const int32_t* topk_ids, const float* topk_weights, int k, float* out,
                          int64_t token_stride, MoeActivationNumerics numerics) {
  const int D = shape.hidden, I = shape.inter, E = shape.experts;
  const std::map<int, ExpertMatrices> used = split_used_experts(shape, experts, topk_ids, tokens * k, numerics);
  parallel_for(tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> xf(D), g, u, h(I), y;
    for (int64_t t = begin; t < end; ++t) {
      for (int c = 0; c < D; ++c) xf[c] = bf16_to_f32(x[t * D + c]);
      for (int j = 0; j < k; ++j) {
        int e = topk_ids[t * k + j];
        if (e < 0 || e >= E) continue;
        pair_output(used.at(e), xf, topk_weights[t * k + j], shape.swiglu_limit, numerics, nullptr, g, u, h, y);
        std::copy(y.begin(), y.end(), out + t * token_stride + int64_t(j) * D);
      }
    }
  });
}

}  // namespace dsv4::cpu
