// MoE routing on the GPU (SPEC §3.7), CpuBackend::route after its gate GEMM (the caller computes the
// f32 gate logits with linear_bf16w).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dsv4::cuda {

// logits f32 [T, E] → ids int32 [T, k], weights f32 [T, k]. aff = sqrt(softplus(z)) (torch softplus,
// threshold 20). Learned routing (hash_table null): the k highest aff + bias[e] (bias f32 [E] or
// null), ties to the lower expert id, highest first. Hash routing: ids[t] = hash_table[token_ids[t]]
// (int32 [vocab, k]; token_ids int32 [T]). weights = aff[id] / Σ aff[ids] · route_scale, the sum in
// listed order. E ≤ 256, 1 ≤ k ≤ E. One warp per token.
void route_topk(const float* logits, const float* bias, const int32_t* hash_table, const int32_t* token_ids, int64_t T,
                int E, int k, float route_scale, int32_t* ids, float* weights, cudaStream_t stream);

}  // namespace dsv4::cuda
