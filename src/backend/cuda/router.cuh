// The router's per-token device steps (router.h), shared by route_topk's kernel and the MoE's fused
// route-and-group kernel (moe_routing.cu): the affinities by one thread per expert, then the
// selection by one warp — lane l holds experts l, l+32, … (≤ 8 each), k rounds of a warp argmax with
// ties to the lower id, the same order as the CPU's stable sort by descending score.
#pragma once
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

namespace dsv4::cuda::router_detail {

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

// Thread i (< kMaxExperts) of token t's group: its affinity into s_aff (hash routing: slot i < k, the
// hashed expert, into s_aff / s_id). The exp and log1p chains are the router's latency, hence a
// thread each.
__device__ __forceinline__ void token_affinities(int i, const float* z, const int32_t* hash_table,
                                                 const int32_t* token_ids, int64_t t, int E, int k, float* s_aff,
                                                 int32_t* s_id) {
  if (hash_table) {
    if (i < k) {
      const int32_t id = hash_table[int64_t(token_ids[t]) * k + i];
      s_id[i] = id;
      s_aff[i] = affinity(z[id]);
    }
  } else if (i < E) {
    s_aff[i] = affinity(z[i]);
  }
}

// One warp (lane): token t's ids and weights from its affinities (after a barrier over
// token_affinities' threads). The kernels pass the bias as a copy in shared memory that they make
// before their programmatic wait (it is a weight): read from global memory here, after the barrier,
// its round trip sat on the decode step's chain (docs/perf/2026-12-06-attention-cluster.md).
__device__ __forceinline__ void token_select(int lane, const float* s_aff, const int32_t* s_id, const float* bias,
                                             bool hash, int E, int k, float route_scale, int32_t* out_ids,
                                             float* out_w) {
  if (hash) {
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

}  // namespace dsv4::cuda::router_detail
