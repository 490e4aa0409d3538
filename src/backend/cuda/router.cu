// Selection by one warp per token: lane l holds experts l, l+32, … (≤ 8 each), k rounds of a warp
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

// A block per token. The affinities (exp and log1p in double: a long dependent chain each) are the
// kernel's latency, so every expert gets its own thread (kMaxExperts threads); hash routing needs
// only the k hashed experts'. Warp 0 then selects as the header says.
__global__ void __launch_bounds__(kMaxExperts)
    route_topk_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                      const int32_t* __restrict__ hash_table, const int32_t* __restrict__ token_ids, int64_t T, int E,
                      int k, float route_scale, int32_t* __restrict__ ids, float* __restrict__ weights) {
  __shared__ float s_aff[kMaxExperts];
  __shared__ int32_t s_id[kMaxExperts];
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const float* z = logits + t * E;
  int32_t* out_ids = ids + t * k;
  float* out_w = weights + t * k;
  const int i = threadIdx.x;
  if (hash_table) {  // slot i < k: the hashed expert (trusted < E) and its affinity
    if (i < k) {
      const int32_t id = hash_table[int64_t(token_ids[t]) * k + i];
      s_id[i] = id;
      s_aff[i] = affinity(z[id]);
    }
  } else if (i < E) {
    s_aff[i] = affinity(z[i]);
  }
  __syncthreads();
  if (i >= 32) return;
  const int lane = i;
  if (hash_table) {
    if (lane == 0) {
      float sum = 0.f;  // Σ aff in listed order, as the CPU
      for (int j = 0; j < k; ++j) sum = __fadd_rn(sum, s_aff[j]);
      for (int j = 0; j < k; ++j) {
        out_ids[j] = s_id[j];
        out_w[j] = __fmul_rn(__fdiv_rn(s_aff[j], sum), route_scale);
      }
    }
    return;
  }
  float aff[kPerLane], score[kPerLane];
  bool taken[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    aff[j] = e < E ? s_aff[e] : 0.f;
    score[j] = e < E && bias ? __fadd_rn(aff[j], bias[e]) : aff[j];
    taken[j] = e >= E;
  }
  float sum = 0.f;  // lane 0: Σ aff in listed order, as the CPU
  for (int r = 0; r < k; ++r) {
    int id = INT_MAX;
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
    if (lane == 0) {
      const float a = s_aff[id];
      out_ids[r] = id;
      out_w[r] = a;
      sum = __fadd_rn(sum, a);
    }
  }
  __syncwarp();
  if (lane == 0)
    for (int r = 0; r < k; ++r) out_w[r] = __fmul_rn(__fdiv_rn(out_w[r], sum), route_scale);
}

}  // namespace

void route_topk(const float* logits, const float* bias, const int32_t* hash_table, const int32_t* token_ids, int64_t T,
                int E, int k, float route_scale, int32_t* ids, float* weights, cudaStream_t stream) {
  if (T < 0 || E <= 0 || E > kMaxExperts || k <= 0 || k > E || (hash_table && !token_ids))
    fail("route_topk: T {}, E {} (≤ {}), k {}{}", T, E, kMaxExperts, k,
         hash_table && !token_ids ? ", hash routing without token ids" : "");
  if (T == 0) return;
  if (T > INT_MAX) fail("route_topk: {} tokens is too many", T);
  launch_programmatic(route_topk_kernel, dim3(unsigned(T)), dim3(kMaxExperts), 0, stream, logits, bias, hash_table,
                      token_ids, T, E, k, route_scale, ids, weights);
  DSV4_CUDA_CHECK_LAUNCH();
}

}  // namespace dsv4::cuda
