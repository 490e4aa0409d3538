// Cache entries, sparse attention with sink, the lightning indexer's scores and top-k, and the
// KV compressors, on the CPU (SPEC §3.4–§3.6, §4.2).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "backend/kv_cache_layout.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace dsv4 {

namespace {
size_t page_bytes(EntryKind kind) {
  return kind == EntryKind::KV ? kv_layout::kKvPageBytes : kv_layout::kIndexFp4PageBytes;
}
}  // namespace

void CpuBackend::grow_pool(EntryPool& pool, int64_t pages) {
  if (pages <= pool.pages) return;
  Tensor bigger = alloc(DType::U8, {pages * int64_t(page_bytes(pool.kind))});
  std::memset(bigger.data, 0, bigger.nbytes());
  if (pool.storage.data) std::memcpy(bigger.data, pool.storage.data, pool.storage.nbytes());
  pool.storage = std::move(bigger);
  pool.pages = pages;
}

void CpuBackend::write_entries(const Tensor& values, const std::vector<int64_t>& rows,
                               const std::vector<int64_t>& entries, EntryPool& pool) {
  const int64_t width = values.numel() / values.rows();
  uint8_t* base = pool.storage.ptr<uint8_t>();
  for (size_t i = 0; i < rows.size(); ++i) {
    DSV4_CHECK(entries[i] >= 0 && entries[i] < pool.pages * kv_layout::kEntriesPerPage, "entry {} outside the pool", entries[i]);
    const uint16_t* v = values.ptr<uint16_t>() + rows[i] * width;
    float f[kv_layout::kHeadDim];
    for (int64_t c = 0; c < width; ++c) f[c] = bf16_to_f32(v[c]);
    if (pool.kind == EntryKind::KV) {
      DSV4_CHECK(width == kv_layout::kHeadDim, "KV entries are {} wide, got {}", kv_layout::kHeadDim, width);
      kv_layout::encode_kv_entry_at(base, entries[i], f);
    } else {
      DSV4_CHECK(width == kv_layout::kIndexDim, "indexer keys are {} wide, got {}", kv_layout::kIndexDim, width);
      kv_layout::encode_index_key_fp4_at(base, entries[i], f);
    }
  }
}

void CpuBackend::copy_entries(const std::vector<int64_t>& src, const std::vector<int64_t>& dst, EntryPool& pool) {
  DSV4_CHECK(pool.kind == EntryKind::KV, "copy_entries: KV pools only");
  uint8_t* base = pool.storage.ptr<uint8_t>();
  for (size_t i = 0; i < src.size(); ++i) {
    std::memmove(base + kv_layout::kv_entry_data_offset(dst[i]), base + kv_layout::kv_entry_data_offset(src[i]),
                 kv_layout::kEntryDataBytes);
    std::memmove(base + kv_layout::kv_entry_scale_offset(dst[i]), base + kv_layout::kv_entry_scale_offset(src[i]),
                 kv_layout::kEntryScaleBytes);
  }
}

Tensor CpuBackend::sparse_attention(const Tensor& q, int n_heads, int head_dim, const EntryPool& kv_pool,
                                    const std::vector<int64_t>& entry_lists, int list_len, const float* sink,
                                    float scale) {
  // SPEC §3.6 with the reference kernel's schedule: blocks of 64 list positions, online softmax in
  // f32, probabilities rounded to bf16 before P·V, the sink added to the denominator at the end.
  DSV4_CHECK(head_dim == kv_layout::kHeadDim, "sparse_attention: head_dim {}", head_dim);
  const int64_t T = q.rows();
  Tensor out = alloc(DType::BF16, {T, n_heads, head_dim});
  const uint8_t* base = kv_pool.storage.ptr<uint8_t>();
  constexpr int kBlock = 64;
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    std::vector<float> keys(size_t(list_len) * size_t(head_dim));
    std::vector<float> qf(static_cast<size_t>(head_dim)), acc(static_cast<size_t>(head_dim));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t* list = entry_lists.data() + t * list_len;
      for (int i = 0; i < list_len; ++i)
        if (list[i] >= 0) kv_layout::decode_kv_entry_at(base, list[i], keys.data() + size_t(i) * size_t(head_dim));
      for (int h = 0; h < n_heads; ++h) {
        const uint16_t* qh = q.ptr<uint16_t>() + (t * n_heads + h) * head_dim;
        for (int c = 0; c < head_dim; ++c) qf[size_t(c)] = bf16_to_f32(qh[c]);
        std::fill(acc.begin(), acc.end(), 0.0f);
        float m = -INFINITY, l = 0;
        float s[kBlock];
        for (int b0 = 0; b0 < list_len; b0 += kBlock) {
          const int b1 = std::min(list_len, b0 + kBlock);
          float bmax = -INFINITY;
          for (int i = b0; i < b1; ++i) {
            if (list[i] < 0) {
              s[i - b0] = -INFINITY;
              continue;
            }
            const float* k = keys.data() + size_t(i) * size_t(head_dim);
            double dot = 0;
            for (int c = 0; c < head_dim; ++c) dot += double(qf[size_t(c)]) * k[c];
            s[i - b0] = float(dot) * scale;
            bmax = std::max(bmax, s[i - b0]);
          }
          if (bmax == -INFINITY) continue;  // a block with no keys leaves the state unchanged
          const float m_new = std::max(m, bmax);
          const float alpha = std::exp(m - m_new);
          float psum = 0;
          for (int c = 0; c < head_dim; ++c) acc[size_t(c)] *= alpha;
          for (int i = b0; i < b1; ++i) {
            if (list[i] < 0) continue;
            float p = std::exp(s[i - b0] - m_new);
            psum += p;
            const float pb = round_bf16(p);
            const float* k = keys.data() + size_t(i) * size_t(head_dim);
            for (int c = 0; c < head_dim; ++c) acc[size_t(c)] += pb * k[c];
          }
          l = l * alpha + psum;
          m = m_new;
        }
        l += std::exp(sink[h] - m);
        uint16_t* o = out.ptr<uint16_t>() + (t * n_heads + h) * head_dim;
        for (int c = 0; c < head_dim; ++c) o[c] = f32_to_bf16(acc[size_t(c)] / l);
      }
    }
  });
  return out;
}

Tensor CpuBackend::indexer_topk(const Tensor& q, const Tensor& head_weights, int n_heads, const EntryPool& key_pool,
                                const std::vector<int64_t>& key_lists, const std::vector<int32_t>& key_counts,
                                int max_keys, int k) {
  // SPEC §3.5 with the reference's bf16 rounding points: per-head dot rounded to bf16, ReLU,
  // product with the bf16 head weight rounded to bf16, head sum in f32 rounded to bf16.
  const int64_t T = q.rows();
  constexpr int d = kv_layout::kIndexDim;
  Tensor out = alloc(DType::I32, {T, k});
  const uint8_t* base = key_pool.storage.ptr<uint8_t>();
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    std::vector<float> key(d), score;
    std::vector<int32_t> order;
    for (int64_t t = t0; t < t1; ++t) {
      const int n = key_counts[size_t(t)];
      score.assign(size_t(n), 0.0f);
      const uint16_t* qt = q.ptr<uint16_t>() + t * n_heads * d;
      const uint16_t* wt = head_weights.ptr<uint16_t>() + t * n_heads;
      for (int j = 0; j < n; ++j) {
        kv_layout::decode_index_key_fp4_at(base, key_lists[size_t(t * max_keys + j)], key.data());
        float sum = 0;
        for (int h = 0; h < n_heads; ++h) {
          double dot = 0;
          for (int c = 0; c < d; ++c) dot += double(bf16_to_f32(qt[h * d + c])) * key[size_t(c)];
          float r = std::max(round_bf16(float(dot)), 0.0f);
          sum += round_bf16(r * bf16_to_f32(wt[h]));
        }
        score[size_t(j)] = round_bf16(sum);
      }
      order.resize(size_t(n));
      std::iota(order.begin(), order.end(), 0);
      const int kk = std::min(k, n);
      std::partial_sort(order.begin(), order.begin() + kk, order.end(), [&](int a, int b) {
        return score[size_t(a)] != score[size_t(b)] ? score[size_t(a)] > score[size_t(b)] : a < b;
      });
      int32_t* o = out.ptr<int32_t>() + t * k;
      for (int i = 0; i < k; ++i) o[i] = i < kk ? order[size_t(i)] : -1;
    }
  });
  return out;
}

void CpuBackend::compressor_state_init(CompressorState& state, int ratio, int d) {
  const int coff = ratio == 4 ? 2 : 1;
  state.kv = alloc(DType::F32, {coff * ratio, coff * d});
  state.score = alloc(DType::F32, {coff * ratio, coff * d});
  std::fill_n(state.kv.ptr<float>(), state.kv.numel(), 0.0f);
  std::fill_n(state.score.ptr<float>(), state.score.numel(), -INFINITY);
}

Tensor CpuBackend::compressor_update(const Tensor& a, const Tensor& g, int64_t row0, int64_t n, int64_t pos0,
                                     const float* ape, int ratio, int d, CompressorState& state) {
  // SPEC §3.4, the reference's decode-path state machine, used for every chunk size (prefill of a
  // whole prompt computes the same softmax pools).
  const int coff = ratio == 4 ? 2 : 1;
  const int width = coff * d;
  float* kv = state.kv.ptr<float>();
  float* sc = state.score.ptr<float>();
  int64_t emitted = 0;
  for (int64_t i = 0; i < n; ++i) emitted += ((pos0 + i + 1) % ratio) == 0;
  Tensor out = alloc(DType::F32, {emitted, d});
  int64_t e = 0;
  std::vector<float> w(size_t(coff * ratio));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = pos0 + i;
    const int phase = int(pos % ratio);
    const int slot = (coff == 2 ? ratio : 0) + phase;
    const float* ar = a.ptr<float>() + (row0 + i) * width;
    const float* gr = g.ptr<float>() + (row0 + i) * width;
    for (int c = 0; c < width; ++c) {
      kv[slot * width + c] = ar[c];
      sc[slot * width + c] = gr[c] + ape[phase * width + c];
    }
    if (phase != ratio - 1) continue;
    float* u = out.ptr<float>() + e * d;
    const int rows = coff * ratio;
    for (int c = 0; c < d; ++c) {
      // Overlapping (ratio 4): rows 0..3 = previous window, first half; rows 4..7 = current, second half.
      auto col = [&](int r) { return coff == 2 ? (r < ratio ? c : d + c) : c; };
      float mx = -INFINITY;
      for (int r = 0; r < rows; ++r) mx = std::max(mx, sc[r * width + col(r)]);
      float sum = 0;
      for (int r = 0; r < rows; ++r) sum += (w[size_t(r)] = std::exp(sc[r * width + col(r)] - mx));
      float acc = 0;
      for (int r = 0; r < rows; ++r) acc += kv[r * width + col(r)] * (w[size_t(r)] / sum);
      u[c] = acc;
    }
    if (coff == 2) {
      std::memcpy(kv, kv + ratio * width, size_t(ratio) * size_t(width) * 4);
      std::memcpy(sc, sc + ratio * width, size_t(ratio) * size_t(width) * 4);
    }
    ++e;
  }
  return out;
}

}  // namespace dsv4
