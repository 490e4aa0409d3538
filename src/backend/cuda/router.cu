// One warp per token: lane l holds experts l, l+32, … (≤ 8 each), selection is k rounds of a warp
// argmax with ties to the lower id — the same order as the CPU's stable sort by descending score.
#include "backend/cuda/router.h"

#include <climits>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/ptx_primitives.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

constexpr int kMaxExperts = 256;
constexpr int kPerLane = kMaxExperts / 32;
constexpr int kWarpsPerBlock = 4;

// sqrt(softplus(z)) with torch's threshold. exp and log1p in double then rounded: the correctly
// rounded f32 results in all but rare cases, as glibc's expf / log1pf (the CPU's) nearly always are,
// so aff differs from the CPU's by at most an ulp where it differs at all.
__device__ __forceinline__ float affinity(float z) {
  const float e = float(exp(double(z)));
  const float sp = z > 20.0f ? z : float(log1p(double(e)));
  return sqrtf(sp);
}

// (score, id) a beats b: higher score, or equal score and lower id; id INT_MAX = nothing.
__device__ __forceinline__ bool beats(float sa, int ia, float sb, int ib) {
  if (ib == INT_MAX) return ia != INT_MAX;
  if (ia == INT_MAX) return false;
  return sa > sb || (sa == sb && ia < ib);
}

__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    route_topk_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                      const int32_t* __restrict__ hash_table, const int32_t* __restrict__ token_ids, int64_t T, int E,
                      int k, float route_scale, int32_t* __restrict__ ids, float* __restrict__ weights) {
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (t >= T) return;
  const float* z = logits + t * E;
  float aff[kPerLane], score[kPerLane];
  bool taken[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    aff[j] = e < E ? affinity(z[e]) : 0.f;
    score[j] = e < E && bias ? __fadd_rn(aff[j], bias[e]) : aff[j];
    taken[j] = e >= E;
  }
  int32_t* out_ids = ids + t * k;
  float* out_w = weights + t * k;
  float sum = 0.f;  // lane 0: Σ aff in listed order, as the CPU
  for (int i = 0; i < k; ++i) {
    int id = INT_MAX;
    if (hash_table) {
      id = hash_table[int64_t(token_ids[t]) * k + i];
    } else {
      float best = 0.f;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j)
        if (!taken[j] && beats(score[j], lane + 32 * j, best, id)) best = score[j], id = lane + 32 * j;
#pragma unroll
      for (int o = 16; o; o >>= 1) {
        const float other_best = __shfl_xor_sync(0xffffffffu, best, o);
        const int other_id = __shfl_xor_sync(0xffffffffu, id, o);
        if (beats(other_best, other_id, best, id)) best = other_best, id = other_id;
      }
#pragma unroll
      for (int j = 0; j < kPerLane; ++j)
        if (lane + 32 * j == id) taken[j] = true;
    }
    // The chosen expert's affinity, from the lane that holds it (hash ids are trusted < E).
    float a = 0.f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (lane + 32 * j == id) a = aff[j];
    a = __shfl_sync(0xffffffffu, a, id % 32);
    if (lane == 0) {
      out_ids[i] = id;
      out_w[i] = a;
      sum = __fadd_rn(sum, a);
    }
  }
  __syncwarp();
  if (lane == 0)
    for (int i = 0; i < k; ++i) out_w[i] = __fmul_rn(__fdiv_rn(out_w[i], sum), route_scale);
}

}  // namespace

void route_topk(const float* logits, const float* bias, const int32_t* hash_table, const int32_t* token_ids, int64_t T,
                int E, int k, float route_scale, int32_t* ids, float* weights, cudaStream_t stream) {
  if (T < 0 || E <= 0 || E > kMaxExperts || k <= 0 || k > E || (hash_table && !token_ids))
    fail("route_topk: T {}, E {} (≤ {}), k {}{}", T, E, kMaxExperts, k,
         hash_table && !token_ids ? ", hash routing without token ids" : "");
  if (T == 0) return;
  launch_programmatic(route_topk_kernel, dim3(unsigned((T + kWarpsPerBlock - 1) / kWarpsPerBlock)),
                      dim3(kWarpsPerBlock * 32), 0, stream, logits, bias, hash_table, token_ids, T, E, k, route_scale,
                      ids, weights);
  DSV4_CUDA_CHECK_LAUNCH();
}

}  // namespace dsv4::cuda
