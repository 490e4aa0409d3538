// The KV compressor's incremental state machine on the GPU (SPEC §3.4), CpuBackend::compressor_update
// and compressor_state_init: per sequence (a slot), per compressor, f32 state of coff·ratio rows ×
// coff·d; one launch updates every span of a step.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dsv4::cuda {

// a, g: f32 [T, coff·d]; spans: I32 [S, 3] on the device (row0, n, pos0 of each span's rows);
// span s updates state slot slots[s] (I32 [S]) of state_kv / state_score, f32 [slots, coff·ratio,
// coff·d] (coff = 2 when ratio == 4, else 1); ape f32 [ratio, coff·d]; out f32 [capacity, d]: the
// entries the step completes, span by span (one per token i of a span with (pos0 + i + 1) % ratio
// == 0), then zero rows. max_span_rows (the longest span) only chooses the kernels.
void compressor_update(const float* a, const float* g, const int32_t* spans, const int32_t* slots, int64_t S,
                       int64_t max_span_rows, const float* ape, int ratio, int d, float* state_kv, float* state_score,
                       float* out, int64_t capacity, cudaStream_t stream);

// One slot (its kv and score pointers): kv = 0, score = −inf.
void compressor_state_init(float* state_kv, float* state_score, int ratio, int d, cudaStream_t stream);

}  // namespace dsv4::cuda
