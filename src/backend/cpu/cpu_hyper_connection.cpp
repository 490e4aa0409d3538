// Hyper-connections (SPEC §3.2, §3.8): f32 math on the bf16 residual streams.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"

namespace dsv4 {

namespace {

float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

// m = (v · fnᵀ) · rsqrt(mean(v²) + eps) for one token's concatenated streams v (f32).
void hc_mixes(const uint16_t* X, int64_t width, const float* fn, int n_mix, float eps, float* m) {
  double ss = 0;
  for (int64_t i = 0; i < width; ++i) {
    float v = bf16_to_f32(X[i]);
    ss += double(v) * v;
  }
  float rs = 1.0f / std::sqrt(float(ss / double(width)) + eps);
  for (int j = 0; j < n_mix; ++j) {
    double acc = 0;
    const float* f = fn + int64_t(j) * width;
    for (int64_t i = 0; i < width; ++i) acc += double(bf16_to_f32(X[i])) * f[i];
    m[j] = float(acc) * rs;
  }
}

}  // namespace

Tensor CpuBackend::hc_pre(const Tensor& X, const HyperConnection& hc, int hc_mult, int iters, float norm_eps,
                          float hc_eps, Tensor* post, Tensor* comb, const uint16_t* norm) {
  const int64_t T = X.rows();
  const int64_t D = X.numel() / T / hc_mult;
  const int n_mix = (2 + hc_mult) * hc_mult;
  Tensor out = alloc(DType::BF16, {T, D});
  *post = alloc(DType::F32, {T, hc_mult});
  *comb = alloc(DType::F32, {T, hc_mult, hc_mult});
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    std::vector<float> m(static_cast<size_t>(n_mix)), pre(static_cast<size_t>(hc_mult));
    for (int64_t t = t0; t < t1; ++t) {
      const uint16_t* xt = X.ptr<uint16_t>() + t * hc_mult * D;
      hc_mixes(xt, hc_mult * D, hc.fn, n_mix, norm_eps, m.data());
      const int n = hc_mult;
      for (int j = 0; j < n; ++j) {
        pre[size_t(j)] = sigmoid(m[size_t(j)] * hc.scale[0] + hc.base[j]) + hc_eps;
        post->ptr<float>()[t * n + j] = 2.0f * sigmoid(m[size_t(n + j)] * hc.scale[1] + hc.base[n + j]);
      }
      // Sinkhorn: row softmax + eps, column normalise, then (iters − 1) × (row, column).
      float* C = comb->ptr<float>() + t * n * n;
      for (int a = 0; a < n; ++a) {
        float mx = -INFINITY;
        for (int b = 0; b < n; ++b) {
          C[a * n + b] = m[size_t(2 * n + a * n + b)] * hc.scale[2] + hc.base[2 * n + a * n + b];
          mx = std::max(mx, C[a * n + b]);
        }
        float s = 0;
        for (int b = 0; b < n; ++b) s += (C[a * n + b] = std::exp(C[a * n + b] - mx));
        for (int b = 0; b < n; ++b) C[a * n + b] = C[a * n + b] / s + hc_eps;
      }
      auto col_norm = [&] {
        for (int b = 0; b < n; ++b) {
          float s = 0;
          for (int a = 0; a < n; ++a) s += C[a * n + b];
          for (int a = 0; a < n; ++a) C[a * n + b] /= (s + hc_eps);
        }
      };
      auto row_norm = [&] {
        for (int a = 0; a < n; ++a) {
          float s = 0;
          for (int b = 0; b < n; ++b) s += C[a * n + b];
          for (int b = 0; b < n; ++b) C[a * n + b] /= (s + hc_eps);
        }
      };
      col_norm();
      for (int it = 1; it < iters; ++it) {
        row_norm();
        col_norm();
      }
      uint16_t* yt = out.ptr<uint16_t>() + t * D;
      for (int64_t d = 0; d < D; ++d) {
        float acc = 0;
        for (int j = 0; j < n; ++j) acc += pre[size_t(j)] * bf16_to_f32(xt[j * D + d]);
        yt[d] = f32_to_bf16(acc);
      }
    }
  });
  return norm ? rms_norm(out, norm, norm_eps) : out;
}

Tensor CpuBackend::hc_post(const Tensor& y, const Tensor& X, const Tensor& post, const Tensor& comb) {
  // X_new[b] = bf(post[b]·y + Σ_a C[a][b]·X[a]).
  const int64_t T = y.rows(), D = y.numel() / T;
  const int n = int(post.numel() / T);
  Tensor out = alloc(DType::BF16, X.shape);
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* p = post.ptr<float>() + t * n;
      const float* C = comb.ptr<float>() + t * n * n;
      const uint16_t* xt = X.ptr<uint16_t>() + t * n * D;
      const uint16_t* yt = y.ptr<uint16_t>() + t * D;
      uint16_t* ot = out.ptr<uint16_t>() + t * n * D;
      for (int b = 0; b < n; ++b)
        for (int64_t d = 0; d < D; ++d) {
          float mix = 0;
          for (int a = 0; a < n; ++a) mix += C[a * n + b] * bf16_to_f32(xt[a * D + d]);
          ot[b * D + d] = f32_to_bf16(p[b] * bf16_to_f32(yt[d]) + mix);
        }
    }
  });
  return out;
}

Tensor CpuBackend::hc_head(const Tensor& X, const HyperConnection& hc, int hc_mult, float norm_eps, float hc_eps,
                           const uint16_t* norm) {
  const int64_t T = X.rows();
  const int64_t D = X.numel() / T / hc_mult;
  Tensor out = alloc(DType::BF16, {T, D});
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    std::vector<float> m(static_cast<size_t>(hc_mult)), pre(static_cast<size_t>(hc_mult));
    for (int64_t t = t0; t < t1; ++t) {
      const uint16_t* xt = X.ptr<uint16_t>() + t * hc_mult * D;
      hc_mixes(xt, hc_mult * D, hc.fn, hc_mult, norm_eps, m.data());
      for (int j = 0; j < hc_mult; ++j) pre[size_t(j)] = sigmoid(m[size_t(j)] * hc.scale[0] + hc.base[j]) + hc_eps;
      uint16_t* yt = out.ptr<uint16_t>() + t * D;
      for (int64_t d = 0; d < D; ++d) {
        float acc = 0;
        for (int j = 0; j < hc_mult; ++j) acc += pre[size_t(j)] * bf16_to_f32(xt[j * D + d]);
        yt[d] = f32_to_bf16(acc);
      }
    }
  });
  return norm ? rms_norm(out, norm, norm_eps) : out;
}

}  // namespace dsv4
