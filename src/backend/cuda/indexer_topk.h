// Lightning indexer (SPEC §3.5) on the FP4 indexer-key cache (backend/kv_cache_layout.h): per query
// token, bf16 scores over every available compressed key, then the top-k (ties → lower index) in
// ascending key order: the attention only needs the set, in an order that walks the cache forwards,
// and the selection needs no sort. (The reference's torch.topk returns descending scores; lists in
// index order group other entries into the attention's 64-entry softmax blocks, a difference at the
// bf16 rounding of P of the same kind as the split-KV partials'.) Device pointers in, no host synchronisation, CUDA-graph capturable.
// Numerics are those of cpu/indexer_reference.h: per head d = bf16(f32 dot), r = max(d, 0),
// prod = bf16(r · w_h), score = bf16(Σ_h prod in f32). (The f32 head sum is a tree here and a
// sequential loop on the CPU; both are exact whenever the 64 products lie within 2^16 of each other.)
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_utils.h"

namespace dsv4::cuda {

inline constexpr int kIndexerHeads = 64;
inline constexpr int kIndexerMaxTopk = 2048;

struct IndexerArgs {
  const __nv_bfloat16* q = nullptr;        // [num_queries, 64, 128] (rotated, FP4-simulated)
  const __nv_bfloat16* weights = nullptr;  // [num_queries, 64] head weights (already scaled)
  const uint8_t* key_pool = nullptr;       // FP4 indexer-key pages
  const int32_t* block_table = nullptr;    // [num_seqs, pages_stride] page ids of each sequence's keys
  int pages_stride = 0;
  const int32_t* query_seq = nullptr;      // [num_queries] block-table row of each query
  const int32_t* key_counts = nullptr;     // [num_queries] keys visible to each query (floor((pos+1)/4))
  int num_queries = 0;
  int max_keys = 0;                        // upper bound of key_counts (sizes the launch)
  int k = 512;                             // 1 … 2048
  int32_t* topk = nullptr;                 // [num_queries, k] key numbers, ascending, −1 padded
};

// Scores are stored as order keys: 16-bit unsigned numbers whose order is the bf16 scores' order
// (−0 stored as +0), so the top-k compares them as integers.
__host__ __device__ constexpr uint32_t indexer_order_key(uint32_t bf16_bits) {
  return bf16_bits == 0x8000u ? 0x8000u : (bf16_bits & 0x8000u) ? (~bf16_bits & 0xffffu) : (bf16_bits | 0x8000u);
}
__host__ __device__ constexpr uint16_t indexer_score_bits(uint32_t order_key) {
  return uint16_t((order_key & 0x8000u) ? (order_key & 0x7fffu) : (~order_key & 0xffffu));
}

// Keys per top-k slice: each slice of a query's keys is one CTA of the two top-k kernels.
inline constexpr int kIndexerTopkSliceKeys = 8192;

// Scratch for up to max_queries × max_keys: scores as order keys (row stride score_stride(), a
// multiple of 8), a 256-bin histogram per query of the scores' high order-key byte (first radix
// pass) and the top-k's per-slice counts. The histogram is zeroed once here; the scores kernel adds to
// it and the top-k reads it and clears it again, so no memset runs per call: every indexer_scores()
// must be followed by one indexer_select_topk() on the same workspace before the next
// indexer_scores().
class IndexerWorkspace {
 public:
  IndexerWorkspace(int max_queries, int max_keys);
  uint16_t* scores() const { return scores_.get(); }
  int score_stride() const { return score_stride_; }
  int32_t* histogram() const { return histogram_.get(); }
  int max_queries() const { return max_queries_; }
  int max_keys() const { return max_keys_; }
  int max_slices() const { return max_slices_; }
  // [max_queries, max_slices, 256] low-byte counts of each slice's keys in the threshold's high-byte
  // bin; [max_queries, max_slices] each slice's keys above that bin; [max_queries] the bin.
  int32_t* slice_hist() const { return slice_hist_.get(); }
  int32_t* slice_greater() const { return slice_greater_.get(); }
  int32_t* high_bin() const { return high_bin_.get(); }

 private:
  int max_queries_, max_keys_, score_stride_, max_slices_;
  DeviceBuffer<uint16_t> scores_;
  DeviceBuffer<int32_t> histogram_, slice_hist_, slice_greater_, high_bin_;
};

// Scores then top-k.
void indexer_topk(const IndexerWorkspace& ws, const IndexerArgs& args, cudaStream_t stream);

// The two stages separately (benchmarks, tests). Scores land in ws.scores() as order keys
// (indexer_score_bits() gives the bf16 bits back), row stride ws.score_stride(); the top-k stage
// needs (and consumes) the scores stage's histogram. All kernels are launched as programmatic dependents (launch latency hidden behind the kernel
// before them).
void indexer_scores(const IndexerWorkspace& ws, const IndexerArgs& args, cudaStream_t stream);
void indexer_select_topk(const IndexerWorkspace& ws, const IndexerArgs& args, cudaStream_t stream);

// CTAs the score kernel launches for these arguments ("SMs busy" in the benchmark).
int indexer_score_ctas(const IndexerArgs& args);

}  // namespace dsv4::cuda
