// CPU reference of the lightning indexer's scores and top-k (SPEC §3.5), on the FP4 indexer-key
// cache of backend/kv_cache_layout.h. Rounding points follow the reference's bf16 tensors:
//   per head h:  d = bf16(f32 dot(q_h, k_j)),  r = max(d, 0),  prod = bf16(r · w_h)
//   score[j]   = bf16( Σ_h prod  in f32, heads in ascending order )
// Top-k: the k highest scores, ties broken by the lower key index, returned in descending-score
// order; when fewer than k keys are available the rest is −1. The CUDA kernels are tested against it.
#pragma once
#include <cstdint>

namespace dsv4::cpu {

inline constexpr int kIndexerHeadDim = 128;

// Scores of one query over n keys. q: bf16 [n_heads, 128]; w: bf16 [n_heads] (already scaled);
// keys: [n, 128] floats (decoded cache values). scores: n floats, each a bf16 value.
void indexer_scores_reference(const uint16_t* q, const uint16_t* w, int n_heads, const float* keys, int n,
                              float* scores);

// Indices of the k largest of scores[0..n) (descending, ties → lower index first); −1 padded.
void topk_reference(const float* scores, int n, int k, int32_t* out);

// A batch of query tokens over the paged FP4 key cache. Query t belongs to sequence query_seq[t]
// and may see keys 0 … key_counts[t] − 1 of it (floor((pos+1)/4) for a CSA layer); key j of sequence
// s is entry block_table[s · pages_stride + j / 64] · 64 + j % 64 of the pool.
struct IndexerBatch {
  int num_queries = 0;
  int n_heads = 64;
  const uint16_t* q = nullptr;        // bf16 [num_queries, n_heads, 128]
  const uint16_t* weights = nullptr;  // bf16 [num_queries, n_heads]
  const uint8_t* key_pool = nullptr;  // FP4 key pages
  const int32_t* block_table = nullptr;
  int pages_stride = 0;
  const int32_t* query_seq = nullptr;
  const int32_t* key_counts = nullptr;
};
// topk: [num_queries, k]. scores (optional): [num_queries, score_stride], entries beyond each
// query's key count untouched.
void indexer_topk_reference(const IndexerBatch& batch, int k, int32_t* topk, float* scores = nullptr,
                            int score_stride = 0);

}  // namespace dsv4::cpu
