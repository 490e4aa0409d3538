#include "backend/cpu/sparse_mla_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/kv_cache_layout.h"
#include "core/dtypes.h"

namespace dsv4::cpu {

namespace kl = dsv4::kv_layout;

void sparse_mla_decode_reference(const uint16_t* q, int num_queries, int n_heads, const uint8_t* window_pool,
                                 const uint8_t* compressed_pool, const SparseMlaLists& lists, const float* sink,
                                 float scale, uint16_t* out) {
  constexpr int D = kl::kHeadDim;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::vector<float> kv, qh(D), acc(D), s(kSparseMlaBlock);
  for (int t = 0; t < num_queries; ++t) {
    const int32_t* list = lists.entries + size_t(t) * lists.list_stride;
    const int len = lists.lengths ? std::min(lists.lengths[t], lists.list_stride) : lists.list_stride;
    // Decode every listed entry once (shared by all heads); −1 / past-the-end positions stay invalid.
    kv.assign(size_t(len) * D, 0.f);
    std::vector<uint8_t> valid(len);
    for (int pos = 0; pos < len; ++pos) {
      valid[pos] = list[pos] >= 0;
      if (valid[pos])
        kl::decode_kv_entry_at(pos < lists.window_len ? window_pool : compressed_pool, list[pos], &kv[size_t(pos) * D]);
    }
    for (int h = 0; h < n_heads; ++h) {
      const uint16_t* qsrc = q + (size_t(t) * n_heads + h) * D;
      for (int d = 0; d < D; ++d) qh[d] = bf16_to_f32(qsrc[d]);
      float m = kNegInf, l = 0.f;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int b0 = 0; b0 < len; b0 += kSparseMlaBlock) {
        const int nb = std::min(kSparseMlaBlock, len - b0);
        float rowmax = kNegInf;
        for (int j = 0; j < nb; ++j) {
          s[j] = kNegInf;
          if (!valid[b0 + j]) continue;
          const float* k = &kv[size_t(b0 + j) * D];
          // The tensor cores sum in a tree; an exact (double) sum rounded once is the closer twin
          // than a long f32 chain.
          double dot = 0.0;
          for (int d = 0; d < D; ++d) dot += double(qh[d]) * k[d];
          s[j] = float(dot) * scale;
          rowmax = std::max(rowmax, s[j]);
        }
        const float m_new = std::max(m, rowmax);
        if (m_new == kNegInf) continue;  // nothing valid yet: the state stays empty
        const float alpha = std::exp(m - m_new);
        float psum = 0.f;
        for (int d = 0; d < D; ++d) acc[d] *= alpha;
        for (int j = 0; j < nb; ++j) {
          if (!valid[b0 + j]) continue;
          const float p = std::exp(s[j] - m_new);
          psum += p;
          const float pb = round_bf16(p);  // SPEC §3.11.6: bf16 probabilities before P·V
          const float* v = &kv[size_t(b0 + j) * D];
          for (int d = 0; d < D; ++d) acc[d] += pb * v[d];
        }
        l = l * alpha + psum;
        m = m_new;
      }
      // Sink: a logit with a zero value vector (SPEC §3.6).
      l += std::exp(sink[h] - m);
      uint16_t* o = out + (size_t(t) * n_heads + h) * D;
      for (int d = 0; d < D; ++d) o[d] = f32_to_bf16(acc[d] / l);
    }
  }
}

void build_sparse_mla_lists_reference(const SparseMlaListInputs& in, int32_t* entries, int32_t* lengths) {
  const int stride = kSparseMlaWindow + in.compressed_capacity;
  const int ring = in.window_pages * kl::kEntriesPerPage;
  for (int t = 0; t < in.num_queries; ++t) {
    int32_t* list = entries + size_t(t) * stride;
    const int seq = in.query_seq[t], pos = in.query_pos[t];
    const int first = std::max(0, pos - (kSparseMlaWindow - 1));
    for (int w = 0; w < kSparseMlaWindow; ++w) {
      const int p = first + w;
      if (p > pos) { list[w] = -1; continue; }
      const int slot = p % ring;
      list[w] = in.window_block_table[size_t(seq) * in.window_pages + slot / kl::kEntriesPerPage] *
                    kl::kEntriesPerPage + slot % kl::kEntriesPerPage;
    }
    auto entry_of = [&](int j) {
      return in.compressed_block_table[size_t(seq) * in.compressed_pages_stride + j / kl::kEntriesPerPage] *
                 kl::kEntriesPerPage + j % kl::kEntriesPerPage;
    };
    int used = 0;
    for (int c = 0; c < in.compressed_capacity; ++c) {
      int32_t g = -1;
      if (in.set == CompressedSet::Selected && c < in.topk_stride) {
        const int j = in.topk[size_t(t) * in.topk_stride + c];
        if (j >= 0) { g = entry_of(j); used = c + 1; }
      } else if (in.set == CompressedSet::All && c < (pos + 1) / in.ratio) {
        g = entry_of(c);
        used = c + 1;
      }
      list[kSparseMlaWindow + c] = g;
    }
    lengths[t] = kSparseMlaWindow + used;
  }
}

}  // namespace dsv4::cpu
