// The KV compressor's incremental state machine on the GPU (SPEC §3.4), CpuBackend::compressor_update
// and compressor_state_init: per sequence, per compressor, f32 state of coff·ratio rows × coff·d.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dsv4::cuda {

// a, g: f32 [rows, coff·d] (rows row0 … row0+n−1 are this sequence's tokens at positions pos0 …);
// ape f32 [ratio, coff·d]; state_kv / state_score f32 [coff·ratio, coff·d] (coff = 2 when ratio == 4,
// else 1); out f32 [emitted, d], one row per token i with (pos0 + i + 1) % ratio == 0, in order.
void compressor_update(const float* a, const float* g, int64_t row0, int64_t n, int64_t pos0, const float* ape, int ratio,
                       int d, float* state_kv, float* state_score, float* out, cudaStream_t stream);

// state_kv = 0, state_score = −inf.
void compressor_state_init(float* state_kv, float* state_score, int ratio, int d, cudaStream_t stream);

}  // namespace dsv4::cuda
