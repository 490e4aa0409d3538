// Penalties: one thread per listed (row, token), a gather-modify-scatter of one logit each.
// Logprobs: one block per row — the maximum by order key (canonical order, as the sampler), the
// sum of exp(l − max) (each term expf of the f32 difference, ≤ 2 ulp, where the CPU twin takes a
// double exp: the double exp's slow path made ptxas spill; the terms are summed in double in
// per-thread strided partials, then a fixed tree, so the result is deterministic for a launch
// shape and equal to the CPU's to ~1e-6), then top_n selection passes, each the largest order key
// below the previous pass's (keys are distinct per id).
#include "backend/cuda/logit_processing.h"

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/ptx_primitives.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

using namespace dsv4::sampling;

constexpr int kPenaltyThreads = 256;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__global__ void __launch_bounds__(kPenaltyThreads) apply_penalties_kernel(float* __restrict__ logits, int vocab,
                                                                          const PenaltyParams* __restrict__ params,
                                                                          const int32_t* __restrict__ entry_rows,
                                                                          const int32_t* __restrict__ ids,
                                                                          const int32_t* __restrict__ output_counts,
                                                                          int64_t entries) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t e = int64_t(blockIdx.x) * kPenaltyThreads + threadIdx.x;
  if (e >= entries) return;
  const int64_t row = entry_rows[e];
  float* l = logits + row * vocab + ids[e];
  *l = penalized_logit(*l, params[row], output_counts[e]);
}

__device__ uint64_t block_max_u64(uint64_t v, uint64_t* warp_values, uint64_t* result) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const uint64_t other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = other > v ? other : v;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // the previous use of warp_values / result is over
  if (lane == 0) warp_values[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t b = warp_values[0];
    for (int w = 1; w < kWarps; ++w) b = warp_values[w] > b ? warp_values[w] : b;
    *result = b;
  }
  __syncthreads();
  return *result;
}

__device__ double block_sum(double v, double* warp_values, double* result) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) warp_values[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0;
    for (int w = 0; w < kWarps; ++w) s += warp_values[w];
    *result = s;
  }
  __syncthreads();
  return *result;
}

__device__ __forceinline__ float logprob_of(float logit, float max_logit, bool finite, double lse) {
  const float v = sanitize_logit(logit);
  if (!finite) return v == max_logit ? 0.0f : bits_float(0xff800000u);
  return float(double(v) - lse);
}

__global__ void __launch_bounds__(kThreads) token_logprobs_kernel(const float* __restrict__ logits, int vocab,
                                                                  const int32_t* __restrict__ chosen, int top_n,
                                                                  float* __restrict__ chosen_logprob,
                                                                  int32_t* __restrict__ top_ids,
                                                                  float* __restrict__ top_logprobs) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ uint64_t warp_keys[kWarps];
  __shared__ double warp_sums[kWarps];
  __shared__ uint64_t key_result;
  __shared__ double sum_result;
  const int64_t row = blockIdx.x;
  const float* l = logits + row * vocab;

  uint64_t best = 0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const uint64_t k = order_key(l[i], i);
    best = k > best ? k : best;
  }
  best = block_max_u64(best, warp_keys, &key_result);
  const float max_logit = sanitize_logit(l[key_token(best)]);
  const float inf = bits_float(0x7f800000u);
  const bool finite = max_logit > -inf && max_logit < inf;
  double partial = 0;
  if (finite)
    for (int i = threadIdx.x; i < vocab; i += kThreads) partial += double(expf(sanitize_logit(l[i]) - max_logit));
  const double lse = double(max_logit) + log(block_sum(partial, warp_sums, &sum_result));
  if (threadIdx.x == 0) chosen_logprob[row] = logprob_of(l[chosen[row]], max_logit, finite, lse);

  uint64_t below = ~uint64_t(0);  // every key is smaller (ids < 2^32 − 1)
  for (int k = 0; k < top_n; ++k) {
    uint64_t mine = 0;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const uint64_t key = order_key(l[i], i);
      if (key < below && key > mine) mine = key;
    }
    below = block_max_u64(mine, warp_keys, &key_result);
    if (threadIdx.x == 0) {
      const int id = key_token(below);
      top_ids[row * top_n + k] = id;
      top_logprobs[row * top_n + k] = logprob_of(l[id], max_logit, finite, lse);
    }
  }
}

}  // namespace

void apply_penalties(float* logits, int vocab, const PenaltyParams* params, const int32_t* entry_rows, const int32_t* ids,
                     const int32_t* output_counts, int64_t entries, cudaStream_t stream) {
  if (entries < 0 || vocab <= 0) fail("apply_penalties: {} entries, vocab {}", entries, vocab);
  if (entries == 0) return;
  const int64_t blocks = (entries + kPenaltyThreads - 1) / kPenaltyThreads;
  launch_programmatic(apply_penalties_kernel, dim3(unsigned(blocks)), dim3(kPenaltyThreads), 0, stream, logits, vocab, params,
                      entry_rows, ids, output_counts, entries);
  DSV4_CUDA_CHECK_LAUNCH();
}

void token_logprobs(const float* logits, int64_t rows, int vocab, const int32_t* chosen, int top_n, float* chosen_logprob,
                    int32_t* top_ids, float* top_logprobs, cudaStream_t stream) {
  if (rows < 0 || rows > int64_t(INT32_MAX) || vocab <= 0 || top_n < 0 || top_n > kMaxTopLogprobs || top_n > vocab)
    fail("token_logprobs: {} rows × vocab {}, top {} (at most {})", rows, vocab, top_n, kMaxTopLogprobs);
  if (rows == 0) return;
  launch_programmatic(token_logprobs_kernel, dim3(unsigned(rows)), dim3(kThreads), 0, stream, logits, vocab, chosen, top_n,
                      chosen_logprob, top_ids, top_logprobs);
  DSV4_CUDA_CHECK_LAUNCH();
}

}  // namespace dsv4::cuda
