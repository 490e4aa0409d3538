// Quantise-on-write into the paged caches of backend/kv_cache_layout.h (SPEC §4.2): KV entries
// (584-byte FP8 layout) and indexer keys (FP4 68-byte or FP8 132-byte entries). Device pointers in,
// no host synchronisation, CUDA-graph capturable. Entry ids are global ids of the pool
// (page · kEntriesPerPage + slot, taken from the sequence's block table); −1 rows are skipped.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dsv4::cuda {

// values: bf16 [n, 512] (448 nope + 64 rope, raw or already FP8-simulated: both store the same bytes).
void append_kv_entries(const __nv_bfloat16* values, const int32_t* entry_ids, int n, uint8_t* pool,
                       cudaStream_t stream);

// values: bf16 [n, 128] indexer keys (already Hadamard-rotated; FP4-simulated or not, the FP4 form
// stores the FP4 simulation of the input).
void append_index_keys_fp4(const __nv_bfloat16* values, const int32_t* entry_ids, int n, uint8_t* pool,
                           cudaStream_t stream);
void append_index_keys_fp8(const __nv_bfloat16* values, const int32_t* entry_ids, int n, uint8_t* pool,
                           cudaStream_t stream);

// Copies KV entries src_ids[i] → dst_ids[i] (data and scales; the window ring's update from a
// step's scratch entries). The two id sets must not overlap.
void copy_kv_entries(const int32_t* src_ids, const int32_t* dst_ids, int n, uint8_t* pool, cudaStream_t stream);

}  // namespace dsv4::cuda
