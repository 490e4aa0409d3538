// CPU linears with the reference's numerics (SPEC §2.2–2.3): FP8 weights take FP8-quantised
// activations (1×128 blocks, power-of-two scales); each K block's partial sum is exact (double)
// and rounded once to f32, scaled and accumulated in f32 in block order — the reference kernels'
// per-block accumulation (their in-block order is the tensor core's, which no CPU reproduces).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace dsv4 {

namespace {

struct QuantizedActivations {
  std::vector<float> values;  // e4m3 values (unscaled), [rows, K]
  std::vector<float> scales;  // [rows, K/128]
};

QuantizedActivations quantize_rows(const Tensor& x, int K) {
  const int64_t rows = x.rows();
  DSV4_CHECK(K % 128 == 0, "activation width {} is not a multiple of 128", K);
  QuantizedActivations q;
  q.values.resize(size_t(rows) * size_t(K));
  q.scales.resize(size_t(rows) * size_t(K / 128));
  const float* lut = cpu::e4m3_table();
  parallel_for(rows, [&](int64_t r0, int64_t r1) {
    float buf[128];
    uint8_t codes[128];
    for (int64_t r = r0; r < r1; ++r)
      for (int kb = 0; kb < K / 128; ++kb) {
        const uint16_t* xr = x.ptr<uint16_t>() + r * K + kb * 128;
        for (int i = 0; i < 128; ++i) buf[i] = bf16_to_f32(xr[i]);
        q.scales[size_t(r) * size_t(K / 128) + size_t(kb)] = cpu::quantize_fp8_block(buf, 128, codes);
        for (int i = 0; i < 128; ++i) q.values[size_t(r) * size_t(K) + size_t(kb) * 128 + size_t(i)] = lut[codes[i]];
      }
  });
  return q;
}

// One FP8 weight row: e4m3 values (unscaled) and the per-128 block scales along K.
struct WeightRow {
  std::vector<float> v;       // K values without the block scale
  std::vector<float> scale;   // K / block
  int block = 128;
};

void load_weight_row(const LinearWeight& w, int n, WeightRow& row) {
  const int K = w.in;
  row.v.resize(size_t(K));
  switch (w.format) {
    case WeightFormat::FP8_BLOCK: {
      const float* lut = cpu::e4m3_table();
      const uint8_t* wr = w.w + size_t(n) * size_t(K);
      for (int k = 0; k < K; ++k) row.v[size_t(k)] = lut[wr[k]];
      row.block = 128;
      const int sb = (K + 127) / 128;
      row.scale.resize(size_t(sb));
      for (int b = 0; b < sb; ++b) row.scale[size_t(b)] = e8m0_to_f32(w.scale[size_t(n / 128) * size_t(sb) + size_t(b)]);
      break;
    }
    case WeightFormat::MXFP4:
    case WeightFormat::NVFP4:
      fail("{}: FP4 weights are routed-expert weights; they run through moe_experts", w.name);
    case WeightFormat::BF16:
      fail("load_weight_row: bf16 weights take the bf16 path");
  }
}

// x·Wᵀ for an FP8 weight: each output's f32 accumulation of its scaled block partials, handed to
// `store(row, n, acc)` (the bf16 rounding of linear, or none for linear_partial).
template <typename Store>
void fp8_block_linear(const Tensor& x, const LinearWeight& w, Store&& store) {
  const int64_t rows = x.rows();
  const int K = w.in, N = w.out;
  QuantizedActivations qa = quantize_rows(x, K);
  parallel_for(N, [&](int64_t n0, int64_t n1) {
    WeightRow wr;
    for (int64_t n = n0; n < n1; ++n) {
      load_weight_row(w, int(n), wr);
      const int blk = wr.block;
      for (int64_t r = 0; r < rows; ++r) {
        const float* xv = qa.values.data() + r * K;
        const float* xs = qa.scales.data() + r * (K / 128);
        float acc = 0;
        for (int b = 0; b < K / blk; ++b) {
          double partial = 0;
          for (int k = b * blk; k < (b + 1) * blk; ++k) partial += double(xv[k]) * double(wr.v[size_t(k)]);
          float s = xs[(b * blk) / 128] * wr.scale[size_t(b)];
          acc += float(partial) * s;
        }
        store(r, n, acc);
      }
    }
  });
}

void check_linear_input(const Tensor& x, const LinearWeight& w) {
  const int64_t rows = x.rows();
  DSV4_CHECK(x.numel() == rows * w.in, "linear {}: input has {} values per row, weight expects {}", w.name,
             x.numel() / std::max<int64_t>(rows, 1), w.in);
}

}  // namespace

Tensor CpuBackend::linear(const Tensor& x, const LinearWeight& w) {
  check_linear_input(x, w);
  if (w.format == WeightFormat::BF16) return linear_bf16(x, reinterpret_cast<const uint16_t*>(w.w), w.out, w.in);
  Tensor out = alloc(DType::BF16, {x.rows(), w.out});
  uint16_t* o = out.ptr<uint16_t>();
  fp8_block_linear(x, w, [&, N = int64_t(w.out)](int64_t r, int64_t n, float acc) { o[r * N + n] = f32_to_bf16(acc); });
  return out;
}

Tensor CpuBackend::linear_partial(const Tensor& x, const LinearWeight& w) {
  // The same sums as linear, before its one rounding: a row-parallel shard's part of it.
  check_linear_input(x, w);
  if (w.format == WeightFormat::BF16) return linear_f32(x, reinterpret_cast<const uint16_t*>(w.w), w.out, w.in);
  Tensor out = alloc(DType::F32, {x.rows(), w.out});
  float* o = out.ptr<float>();
  fp8_block_linear(x, w, [&, N = int64_t(w.out)](int64_t r, int64_t n, float acc) { o[r * N + n] = acc; });
  return out;
}

Tensor CpuBackend::linear_bf16(const Tensor& x, const uint16_t* w, int out_dim, int in) {
  const int64_t rows = x.rows();
  std::vector<float> xf(size_t(x.numel()));
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = bf16_to_f32(x.ptr<uint16_t>()[i]);
  Tensor out = alloc(DType::BF16, {rows, out_dim});
  parallel_for(out_dim, [&](int64_t n0, int64_t n1) {
    std::vector<float> wr(static_cast<size_t>(in));
    for (int64_t n = n0; n < n1; ++n) {
      for (int k = 0; k < in; ++k) wr[size_t(k)] = bf16_to_f32(w[size_t(n) * size_t(in) + size_t(k)]);
      for (int64_t r = 0; r < rows; ++r) {
        double acc = 0;
        const float* xr = xf.data() + r * in;
        for (int k = 0; k < in; ++k) acc += double(xr[k]) * wr[size_t(k)];
        out.ptr<uint16_t>()[r * out_dim + n] = f32_to_bf16(float(acc));
      }
    }
  });
  return out;
}

Tensor CpuBackend::linear_f32(const Tensor& x, const uint16_t* w, int out_dim, int in) {
  const int64_t rows = x.rows();
  std::vector<float> xf(size_t(x.numel()));
  for (size_t i = 0; i < xf.size(); ++i)
    xf[i] = x.dtype == DType::BF16 ? bf16_to_f32(x.ptr<uint16_t>()[i]) : x.ptr<float>()[i];
  Tensor out = alloc(DType::F32, {rows, out_dim});
  parallel_for(out_dim, [&](int64_t n0, int64_t n1) {
    std::vector<float> wr(static_cast<size_t>(in));
    for (int64_t n = n0; n < n1; ++n) {
      for (int k = 0; k < in; ++k) wr[size_t(k)] = bf16_to_f32(w[size_t(n) * size_t(in) + size_t(k)]);
      for (int64_t r = 0; r < rows; ++r) {
        double acc = 0;
        const float* xr = xf.data() + r * in;
        for (int k = 0; k < in; ++k) acc += double(xr[k]) * wr[size_t(k)];
        out.ptr<float>()[r * out_dim + n] = float(acc);
      }
    }
  });
  return out;
}

Tensor CpuBackend::grouped_out_proj(const Tensor& o, const LinearWeight& wo_a, int groups, int rank) {
  // z[t, g, r] = bf(Σ_d o[t, g, d] · wo_a[g, r, d]); the reference's bf16 einsum (SPEC §3.3) over the
  // weight's bf16 values (an FP8 code times its power-of-two scale is one, exactly).
  const int64_t rows = o.rows();
  const int64_t gd = o.numel() / rows / groups;
  DSV4_CHECK(wo_a.out == groups * rank && wo_a.in == gd && (wo_a.format == WeightFormat::BF16 || wo_a.format == WeightFormat::FP8_BLOCK),
             "grouped_out_proj: {} weight [{}, {}] for {} groups of {} × {}", weight_format_name(wo_a.format), wo_a.out,
             wo_a.in, groups, rank, gd);
  Tensor out = alloc(DType::BF16, {rows, int64_t(groups) * rank});
  const int64_t scale_cols = (gd + 127) / 128;
  parallel_for(int64_t(groups) * rank, [&](int64_t j0, int64_t j1) {
    std::vector<float> wr(static_cast<size_t>(gd));
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t g = j / rank;
      for (int64_t d = 0; d < gd; ++d) {
        const size_t at = size_t(j * gd + d);
        wr[size_t(d)] = wo_a.format == WeightFormat::BF16
                            ? bf16_to_f32(reinterpret_cast<const uint16_t*>(wo_a.w)[at])
                            : e4m3_to_f32(wo_a.w[at]) * e8m0_to_f32(wo_a.scale[size_t(j / 128 * scale_cols + d / 128)]);
      }
      for (int64_t t = 0; t < rows; ++t) {
        const uint16_t* orow = o.ptr<uint16_t>() + (t * groups + g) * gd;
        double acc = 0;
        for (int64_t d = 0; d < gd; ++d) acc += double(bf16_to_f32(orow[d])) * wr[size_t(d)];
        out.ptr<uint16_t>()[t * groups * rank + j] = f32_to_bf16(float(acc));
      }
    }
  });
  return out;
}

}  // namespace dsv4
