// What happens to a logits row around sampling, on the GPU: penalties before it (exact, the CPU
// twin's bits: sampling::penalized_logit) and log-probabilities after it (logprobs_reference to
// rounding: the sum of exponentials is reduced in another order). CPU twins in
// backend/cpu/sampling_reference.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cpu/sampling_reference.h"

namespace dsv4::cuda {

// logits f32 [rows, vocab] in place; entry e rewrites logits[entry_rows[e], ids[e]] with
// params[entry_rows[e]] and output_counts[e]. Ids are distinct within a row. Device memory;
// enqueues only.
void apply_penalties(float* logits, int vocab, const PenaltyParams* params, const int32_t* entry_rows, const int32_t* ids,
                     const int32_t* output_counts, int64_t entries, cudaStream_t stream);

inline constexpr int kMaxTopLogprobs = 32;

// Per row of logits f32 [rows, vocab]: chosen_logprob[r] for chosen[r], and the top_n (≤ 32) tokens
// in canonical order with their logprobs (top_ids / top_logprobs [rows, top_n]). Device memory;
// one block per row; enqueues only.
void token_logprobs(const float* logits, int64_t rows, int vocab, const int32_t* chosen, int top_n, float* chosen_logprob,
                    int32_t* top_ids, float* top_logprobs, cudaStream_t stream);

}  // namespace dsv4::cuda
