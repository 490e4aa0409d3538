// CPU backend: memory, elementwise and row ops, the head.
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/sampling_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"

namespace dsv4 {

Tensor CpuBackend::alloc(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  size_t n = std::max<size_t>(t.nbytes(), 1);
  t.storage = std::shared_ptr<uint8_t>(new uint8_t[n], std::default_delete<uint8_t[]>());
  t.data = t.storage.get();
  return t;
}

Tensor CpuBackend::from_host(DType dtype, std::vector<int64_t> shape, const void* data) {
  Tensor t = alloc(dtype, std::move(shape));
  if (t.nbytes()) std::memcpy(t.data, data, t.nbytes());
  return t;
}

void CpuBackend::upload(const Tensor& dst, const void* data) {
  if (dst.nbytes()) std::memcpy(dst.data, data, dst.nbytes());
}

Tensor CpuBackend::generate(const RandomFill& fill, DType dtype, std::vector<int64_t> shape) {
  Tensor t = alloc(dtype, std::move(shape));
  DSV4_CHECK(size_t(random_fill_element_bytes(fill.kind)) == dtype_size(dtype), "generate: a {}-byte fill for {}",
             random_fill_element_bytes(fill.kind), dtype_name(dtype));
  random_fill_reference(fill, t.data, t.numel());
  return t;
}

void CpuBackend::to_host(const Tensor& t, void* dst) {
  if (t.nbytes()) std::memcpy(dst, t.data, t.nbytes());
}

void CpuBackend::copy_rows(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row, int64_t rows) {
  size_t row_bytes = src.rows() ? src.nbytes() / size_t(src.rows()) : 0;
  std::memcpy(static_cast<uint8_t*>(dst.data) + size_t(dst_row) * row_bytes,
              static_cast<const uint8_t*>(src.data) + size_t(src_row) * row_bytes, size_t(rows) * row_bytes);
}

Tensor CpuBackend::embed(const Tensor& ids, const uint16_t* table, int dim) {
  const int64_t n = ids.numel();
  Tensor out = alloc(DType::BF16, {n, dim});
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(out.ptr<uint16_t>() + i * dim, table + size_t(ids.ptr<int32_t>()[i]) * size_t(dim), size_t(dim) * 2);
  return out;
}

Tensor CpuBackend::rms_norm(const Tensor& x, const uint16_t* weight, float eps) {
  // SPEC §2.1: f32 math, y = bf(w ⊙ (x · rsqrt(mean(x²) + eps))).
  const int64_t rows = x.rows(), n = x.numel() / std::max<int64_t>(rows, 1);
  Tensor out = alloc(DType::BF16, x.shape);
  parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint16_t* xr = x.ptr<uint16_t>() + r * n;
      uint16_t* yr = out.ptr<uint16_t>() + r * n;
      double ss = 0;
      for (int64_t i = 0; i < n; ++i) {
        float v = bf16_to_f32(xr[i]);
        ss += double(v) * v;
      }
      float rs = 1.0f / std::sqrt(float(ss / double(n)) + eps);
      for (int64_t i = 0; i < n; ++i) yr[i] = f32_to_bf16(bf16_to_f32(weight[i]) * (bf16_to_f32(xr[i]) * rs));
    }
  });
  return out;
}

void CpuBackend::head_rms_norm(Tensor& x, int head_dim, float eps) {
  // SPEC §3.11.3: the reference does this on bf16 tensors: squares rounded to bf16, the mean
  // accumulated in f32 and rounded to bf16, + eps rounded to bf16, rsqrt in f32 rounded once.
  const int64_t heads = x.numel() / head_dim;
  parallel_for(heads, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      uint16_t* v = x.ptr<uint16_t>() + h * head_dim;
      float sum = 0;
      for (int i = 0; i < head_dim; ++i) {
        float f = bf16_to_f32(v[i]);
        sum += round_bf16(f * f);
      }
      float mean = round_bf16(sum / float(head_dim));
      float var = round_bf16(mean + eps);
      float r = round_bf16(1.0f / std::sqrt(var));
      for (int i = 0; i < head_dim; ++i) v[i] = f32_to_bf16(bf16_to_f32(v[i]) * r);
    }
  });
}

void CpuBackend::rope(Tensor& x, int head_dim, int rope_dim, const Tensor& positions_t, const RopeTable& table,
                      bool inverse) {
  const int64_t rows = x.rows();
  if (!rows) return;
  const int64_t heads = x.numel() / rows / head_dim;
  DSV4_CHECK(positions_t.numel() == rows, "rope: {} positions for {} rows", positions_t.numel(), rows);
  const int32_t* positions = positions_t.ptr<int32_t>();
  parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float pos = float(positions[r]);
      for (int64_t h = 0; h < heads; ++h) {
        uint16_t* v = x.ptr<uint16_t>() + (r * heads + h) * head_dim + (head_dim - rope_dim);
        for (int i = 0; i < rope_dim / 2; ++i) {
          float ang = pos * table.inv_freq[size_t(i)];  // f32 product, as torch.outer in f32
          float c = float(std::cos(double(ang))), s = float(std::sin(double(ang)));
          if (inverse) s = -s;
          float a = bf16_to_f32(v[2 * i]), b = bf16_to_f32(v[2 * i + 1]);
          v[2 * i] = f32_to_bf16(a * c - b * s);
          v[2 * i + 1] = f32_to_bf16(a * s + b * c);
        }
      }
    }
  });
}

void CpuBackend::fp8_simulate(Tensor& x, int row_width, int channels) {
  const int64_t rows = x.numel() / row_width;
  parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int c = 0; c < channels; c += 64) cpu::fp8_simulate_block(x.ptr<uint16_t>() + r * row_width + c, 64);
  });
}

void CpuBackend::hadamard_fp4_simulate(Tensor& x, int width) {
  DSV4_CHECK(width == 128, "hadamard: width {} (only 128 is used by the model)", width);
  const int64_t n = x.numel() / width;
  parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      uint16_t* v = x.ptr<uint16_t>() + i * width;
      cpu::hadamard128(v);
      for (int c = 0; c < width; c += 32) cpu::fp4_simulate_block(v + c, 32);
    }
  });
}

Tensor CpuBackend::add(const Tensor& a, const Tensor& b) {
  Tensor out = alloc(DType::BF16, a.shape);
  for (int64_t i = 0; i < a.numel(); ++i)
    out.ptr<uint16_t>()[i] = f32_to_bf16(bf16_to_f32(a.ptr<uint16_t>()[i]) + bf16_to_f32(b.ptr<uint16_t>()[i]));
  return out;
}

Tensor CpuBackend::scale(const Tensor& x, float s) {
  Tensor out = alloc(DType::BF16, x.shape);
  for (int64_t i = 0; i < x.numel(); ++i) out.ptr<uint16_t>()[i] = f32_to_bf16(bf16_to_f32(x.ptr<uint16_t>()[i]) * s);
  return out;
}

Tensor CpuBackend::to_bf16(const Tensor& x) {
  Tensor out = alloc(DType::BF16, x.shape);
  for (int64_t i = 0; i < x.numel(); ++i) out.ptr<uint16_t>()[i] = f32_to_bf16(x.ptr<float>()[i]);
  return out;
}

Tensor CpuBackend::logits(const Tensor& h, const uint16_t* head, int vocab) {
  return linear_f32(h, head, vocab, int(h.numel() / h.rows()));
}

Tensor CpuBackend::sample(const Tensor& logits, const Tensor& params, const Tensor& counters) {
  const int64_t rows = logits.rows();
  DSV4_CHECK(int64_t(params.nbytes()) == rows * int64_t(sizeof(SamplingParams)) && int64_t(counters.nbytes()) == rows * 8,
             "sample: {} rows, {} parameter bytes, {} counter bytes", rows, params.nbytes(), counters.nbytes());
  Tensor out = alloc(DType::I32, {rows});
  if (rows)
    sample_reference(logits.ptr<float>(), rows, int(logits.numel() / rows), static_cast<const SamplingParams*>(params.data),
                     static_cast<const uint64_t*>(counters.data), out.ptr<int32_t>());
  return out;
}

void CpuBackend::apply_penalties(Tensor& logits, const Tensor& params, const Tensor& rows, const Tensor& ids,
                                 const Tensor& counts) {
  const int64_t R = logits.rows(), n = ids.numel();
  if (!n || !ids.data) return;
  DSV4_CHECK(rows.numel() == n && counts.numel() == n && int64_t(params.nbytes()) == R * int64_t(sizeof(PenaltyParams)),
             "apply_penalties: {} rows of logits, {} entries", R, n);
  const int vocab = int(logits.numel() / R);
  const auto* p = static_cast<const PenaltyParams*>(params.data);
  for (int64_t e = 0; e < n; ++e) {
    const int32_t r = rows.ptr<int32_t>()[e], id = ids.ptr<int32_t>()[e];
    DSV4_CHECK(r >= 0 && r < R && id >= 0 && id < vocab, "apply_penalties: entry {} (row {}, token {})", e, r, id);
    float& l = logits.ptr<float>()[int64_t(r) * vocab + id];
    l = sampling::penalized_logit(l, p[r], counts.ptr<int32_t>()[e]);
  }
}

LogprobRows CpuBackend::logprobs(const Tensor& logits, const Tensor& chosen, int top_n) {
  const int64_t rows = logits.rows();
  DSV4_CHECK(chosen.numel() == rows && top_n >= 0 && top_n <= 32, "logprobs: {} rows, {} chosen, top {}", rows, chosen.numel(), top_n);
  const int vocab = rows ? int(logits.numel() / rows) : 0;
  LogprobRows out{alloc(DType::F32, {rows}), alloc(DType::I32, {rows, top_n}), alloc(DType::F32, {rows, top_n})};
  for (int64_t r = 0; r < rows; ++r) {
    TokenLogprobs t = logprobs_reference(logits.ptr<float>() + r * vocab, vocab, chosen.ptr<int32_t>()[r], std::min(top_n, vocab));
    out.chosen.ptr<float>()[r] = t.chosen;
    for (size_t k = 0; k < t.top_ids.size(); ++k) {
      out.top_ids.ptr<int32_t>()[r * top_n + int64_t(k)] = t.top_ids[k];
      out.top.ptr<float>()[r * top_n + int64_t(k)] = t.top[k];
    }
  }
  return out;
}

Tensor CpuBackend::gather_rows(const Tensor& src, const Tensor& rows) {
  const int64_t n = rows.data ? rows.numel() : 0, src_rows = src.rows();
  std::vector<int64_t> shape = src.shape;
  shape[0] = n;
  Tensor out = alloc(src.dtype, shape);
  const size_t row_bytes = src_rows ? src.nbytes() / size_t(src_rows) : 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t r = rows.ptr<int32_t>()[i];
    DSV4_CHECK(r >= 0 && r < src_rows, "gather_rows: row {} of {}", r, src_rows);
    std::memcpy(out.ptr<uint8_t>() + size_t(i) * row_bytes, src.ptr<uint8_t>() + size_t(r) * row_bytes, row_bytes);
  }
  return out;
}

}  // namespace dsv4
