#include "backend/cpu/indexer_reference.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "backend/kv_cache_layout.h"
#include "core/dtypes.h"

namespace dsv4::cpu {

namespace kl = dsv4::kv_layout;

void indexer_scores_reference(const uint16_t* q, const uint16_t* w, int n_heads, const float* keys, int n,
                              float* scores) {
  std::vector<float> qf(size_t(n_heads) * kIndexerHeadDim), wf(n_heads);
  for (size_t i = 0; i < qf.size(); ++i) qf[i] = bf16_to_f32(q[i]);
  for (int h = 0; h < n_heads; ++h) wf[h] = bf16_to_f32(w[h]);
  for (int j = 0; j < n; ++j) {
    const float* k = keys + size_t(j) * kIndexerHeadDim;
    float sum = 0.f;
    for (int h = 0; h < n_heads; ++h) {
      const float* qh = &qf[size_t(h) * kIndexerHeadDim];
      float dot = 0.f;
      for (int d = 0; d < kIndexerHeadDim; ++d) dot += qh[d] * k[d];
      const float r = std::max(round_bf16(dot), 0.f);
      sum += round_bf16(r * wf[h]);
    }
    scores[j] = round_bf16(sum);
  }
}

void topk_reference(const float* scores, int n, int k, int32_t* out) {
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  const int take = std::min(n, k);
  std::partial_sort(idx.begin(), idx.begin() + take, idx.end(), [&](int32_t a, int32_t b) {
    return scores[a] != scores[b] ? scores[a] > scores[b] : a < b;
  });
  for (int i = 0; i < k; ++i) out[i] = i < take ? idx[i] : -1;
}

void indexer_topk_reference(const IndexerBatch& b, int k, int32_t* topk, float* scores_out, int score_stride) {
  std::vector<float> keys, scores;
  for (int t = 0; t < b.num_queries; ++t) {
    const int n = b.key_counts[t];
    const int32_t* table = b.block_table + size_t(b.query_seq[t]) * b.pages_stride;
    keys.resize(size_t(n) * kIndexerHeadDim);
    for (int j = 0; j < n; ++j) {
      const int64_t g = int64_t(table[j / kl::kEntriesPerPage]) * kl::kEntriesPerPage + j % kl::kEntriesPerPage;
      kl::decode_index_key_fp4_at(b.key_pool, g, &keys[size_t(j) * kIndexerHeadDim]);
    }
    scores.resize(n);
    indexer_scores_reference(b.q + size_t(t) * b.n_heads * kIndexerHeadDim, b.weights + size_t(t) * b.n_heads,
                             b.n_heads, keys.data(), n, scores.data());
    topk_reference(scores.data(), n, k, topk + size_t(t) * k);
    if (scores_out) std::copy(scores.begin(), scores.end(), scores_out + size_t(t) * score_stride);
  }
}

}  // namespace dsv4::cpu
