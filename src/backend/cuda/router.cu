// The router (router.h): a block per token, the steps of router.cuh.
#include "backend/cuda/router.h"

#include <climits>

#include "backend/cuda/router.cuh"

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/ptx_primitives.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

using namespace router_detail;

// A block per token: every expert's affinity its own thread, then warp 0 selects (router.cuh).
__global__ void __launch_bounds__(kMaxExperts)
    route_topk_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                      const int32_t* __restrict__ hash_table, const int32_t* __restrict__ token_ids, int64_t T, int E,
                      int k, float route_scale, int32_t* __restrict__ ids, float* __restrict__ weights) {
  __shared__ float s_aff[kMaxExperts];
  __shared__ int32_t s_id[kMaxExperts];
  __shared__ float s_bias[kMaxExperts];  // (a weight: copied before the wait, see token_select)
  if (bias && int(threadIdx.x) < E) s_bias[threadIdx.x] = bias[threadIdx.x];
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  token_affinities(threadIdx.x, logits + t * E, hash_table, token_ids, t, E, k, s_aff, s_id);
  __syncthreads();
  if (threadIdx.x >= 32) return;
  token_select(threadIdx.x, s_aff, s_id, bias ? s_bias : nullptr, hash_table != nullptr, E, k, route_scale, ids + t * k, weights + t * k);
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
