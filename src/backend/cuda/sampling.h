// Token sampling on the GPU with per-row parameters (greedy, temperature, top-k, min-p, top-p),
// token for token the same as sample_reference (backend/cpu/sampling_reference.h, which defines the
// algorithm): integer masses and a deterministic exp make the choice exact, not approximately equal.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cpu/sampling_reference.h"

namespace dsv4::cuda {

// Scratch sample_tokens needs: one f32 per logit (the row's probability weights), 256-byte aligned
// in total.
size_t sampling_workspace_bytes(int64_t rows, int vocab);

// logits f32 [rows, vocab]; params [rows]; counters [rows] (tokens each sequence has generated);
// out int32 [rows]; workspace ≥ sampling_workspace_bytes(rows, vocab), 16-byte aligned. All device
// memory. rows ≤ 65535 (a pass of 32 blocks per row finds each row's greedy token, then one block per
// row samples); vocab up to 2^23. Enqueues only (graph-capturable).
void sample_tokens(const float* logits, int64_t rows, int vocab, const SamplingParams* params, const uint64_t* counters,
                   int32_t* out, void* workspace, cudaStream_t stream);

}  // namespace dsv4::cuda
