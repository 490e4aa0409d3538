// CPU reference of DeepSeek-V4 sparse attention with sink at decode (SPEC §3.6), on the FP8 paged
// KV layout of backend/kv_cache_layout.h. It walks each query's entry list in blocks of 64 list
// positions exactly as the reference kernel does (f32 scores, online softmax in f32, probabilities
// rounded to bf16 before P·V, f32 accumulation, bf16 output); the CUDA kernel is tested against it.
#pragma once
#include <cstdint>

namespace dsv4::cpu {

inline constexpr int kSparseMlaBlock = 64;     // list positions per online-softmax block
inline constexpr int kSparseMlaWindow = 128;   // window part of every list (SPEC §3.6)

// Entry lists of one batch of query tokens: query t's list is lists[t·list_stride ...], of which the
// first `lengths[t]` positions are walked (positions ≥ lengths[t] count as −1). Positions
// [0, window_len) address `window_pool`, the rest `compressed_pool` (they may be the same pool).
// Entries are global ids of kv_cache_layout.h; −1 = no entry.
struct SparseMlaLists {
  const int32_t* entries = nullptr;  // [num_queries, list_stride]
  const int32_t* lengths = nullptr;  // [num_queries]; nullptr = list_stride for every query
  int list_stride = 0;
  int window_len = kSparseMlaWindow;
};

// q: bf16 [num_queries, n_heads, 512]; sink: f32 [n_heads]; out: bf16 [num_queries, n_heads, 512].
// scale = 512^-0.5 for DeepSeek-V4.
void sparse_mla_decode_reference(const uint16_t* q, int num_queries, int n_heads, const uint8_t* window_pool,
                                 const uint8_t* compressed_pool, const SparseMlaLists& lists, const float* sink,
                                 float scale, uint16_t* out);

// Which compressed entries a query attends to, besides its window.
enum class CompressedSet {
  None,      // sliding-window-only layer
  Selected,  // CSA: the indexer's top-k (entry numbers within the sequence, −1 padded)
  All,       // HCA: every available entry 0 … floor((pos+1)/ratio) − 1
};

// Builds the entry lists of SPEC §3.6 from block tables (the CUDA twin is build_sparse_mla_lists):
//   positions [0,128): window positions max(0,i−127) … i ascending (ring slot = position mod ring
//     size, ring size = window_pages · kEntriesPerPage ≥ 128), −1 padded;
//   positions [128, 128 + compressed_capacity): Selected = topk[t] mapped through the compressed
//     block table, All = entries 0…n−1 ascending; −1 padded.
// lengths[t] = 128 + number of compressed entries used. list_stride = 128 + compressed_capacity.
struct SparseMlaListInputs {
  int num_queries = 0;
  const int32_t* query_seq = nullptr;         // [num_queries] sequence (block-table row) of each query
  const int32_t* query_pos = nullptr;         // [num_queries] absolute position of each query token
  const int32_t* window_block_table = nullptr;  // [num_seqs, window_pages]
  int window_pages = 2;
  const int32_t* compressed_block_table = nullptr;  // [num_seqs, compressed_pages_stride]
  int compressed_pages_stride = 0;
  CompressedSet set = CompressedSet::None;
  const int32_t* topk = nullptr;  // Selected: [num_queries, topk_stride]
  int topk_stride = 0;
  int ratio = 4;                  // All: compression ratio (128 for HCA)
  int compressed_capacity = 0;    // list positions reserved after the window
};
void build_sparse_mla_lists_reference(const SparseMlaListInputs& in, int32_t* entries, int32_t* lengths);

}  // namespace dsv4::cpu
