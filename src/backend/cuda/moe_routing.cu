// Routing-side kernels of the FP4 MoE: group the (token, expert) pairs of a top-k result by expert
// (a counting sort in one block, graph-safe: everything stays on the device), and the final per-token
// weighted sum of the expert outputs plus the shared expert's (SPEC.md §3.7). The routing weights are
// already applied inside the gate-up GEMM's epilogue (before w2, as the reference does), so the
// combine is a plain sum in the reference's order: experts by id, then the shared expert. Both are
// launched as programmatic dependents, like the expert GEMMs between them (launch latency hidden).
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <string>

#include "backend/cuda/moe_fp4.h"
#include "backend/cuda/ptx_primitives.cuh"
#include "backend/cuda/router.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

constexpr int kRouteThreads = 1024;  // one thread per expert in the scans: E ≤ 1024
constexpr int kMaxK = 16;  // top-k per token the combine handles (DeepSeek-V4-Flash: 6)
// The combines come in widths of 8 and 16 pairs: every loop over the pairs is unrolled, and at one
// token the kernel runs cold on the decode chain, where its instructions cost by the KB
// (docs/perf/2026-12-06-stream-priority.md: 34 KB of code at 16, 13 KB at 8).
constexpr int combine_width(int k) { return k <= 8 ? 8 : kMaxK; }
constexpr int kCombineThreads = 128;
static_assert(kFusedRouteTokens * router_detail::kMaxExperts == kRouteThreads, "a token per 256 threads");

// Exclusive block-wide prefix sums of two counters at once; returns the totals in *total_a/*total_b.
__device__ void block_exclusive_scan2(int& a, int& b, int* total_a, int* total_b) {
  __shared__ int warp_a[32], warp_b[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int ia = a, ib = b;
  for (int d = 1; d < 32; d *= 2) {
    int ta = __shfl_up_sync(0xffffffffu, ia, d), tb = __shfl_up_sync(0xffffffffu, ib, d);
    if (lane >= d) ia += ta, ib += tb;
  }
  if (lane == 31) warp_a[warp] = ia, warp_b[warp] = ib;
  __syncthreads();
  if (warp == 0) {
    int wa = warp_a[lane], wb = warp_b[lane];
    for (int d = 1; d < 32; d *= 2) {
      int ta = __shfl_up_sync(0xffffffffu, wa, d), tb = __shfl_up_sync(0xffffffffu, wb, d);
      if (lane >= d) wa += ta, wb += tb;
    }
    warp_a[lane] = wa, warp_b[lane] = wb;  // inclusive over warps
  }
  __syncthreads();
  int base_a = warp ? warp_a[warp - 1] : 0, base_b = warp ? warp_b[warp - 1] : 0;
  a = base_a + ia - a;
  b = base_b + ib - b;
  *total_a = warp_a[31];
  *total_b = warp_b[31];
}

// Where the grouping goes (MoeWorkspace's arrays).
struct PairGroups {
  int32_t *active_count, *slot_expert, *slot_begin, *slot_count, *sorted_pairs;
  int pass_cap;
  int32_t *pass_total, *pass_expert, *pass_begin, *pass_rows;
};

PairGroups pair_groups(MoeWorkspace& ws, int pass_cap) {
  return {ws.active_count.get(), ws.slot_expert.get(), ws.slot_begin.get(), ws.slot_count.get(),
          ws.sorted_pairs.get(),  pass_cap,           ws.pass_total.get(),  ws.pass_expert.get(),
          ws.pass_begin.get(),    ws.pass_rows.get()};
}

// The grouping by a block of kRouteThreads threads (ids readable by the whole block).
__device__ void group_pairs(const int32_t* ids, int pairs, int experts, const PairGroups& g) {
  int32_t *active_count = g.active_count, *slot_expert = g.slot_expert, *slot_begin = g.slot_begin,
          *slot_count = g.slot_count, *sorted_pairs = g.sorted_pairs, *pass_total = g.pass_total,
          *pass_expert = g.pass_expert, *pass_begin = g.pass_begin, *pass_rows = g.pass_rows;
  const int pass_cap = g.pass_cap;
  __shared__ int count[kRouteThreads], cursor[kRouteThreads];
  const int tid = threadIdx.x;
  count[tid] = 0;
  __syncthreads();
  for (int p = tid; p < pairs; p += kRouteThreads) {
    int e = ids[p];
    if (e >= 0 && e < experts) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  const int c = tid < experts ? count[tid] : 0;
  int offset = c, slot = c > 0 ? 1 : 0, total_pairs, active;
  block_exclusive_scan2(offset, slot, &total_pairs, &active);
  if (c > 0) {
    slot_expert[slot] = tid;
    slot_begin[slot] = offset;
    slot_count[slot] = c;
  }
  // Slots past the active ones are marked empty, so a GEMM block needs one dependent load to start.
  if (tid >= active && tid < experts) slot_expert[tid] = -1;
  if (tid == 0) *active_count = active;
  // Passes: each expert's pairs cut into runs of at most pass_cap rows, in expert order (only the
  // streaming kernel reads them; pass_cap 0 skips the second scan).
  if (pass_cap > 0) {
    int passes = (c + pass_cap - 1) / pass_cap, unused = 0, total_passes, unused_total;
    __syncthreads();  // the scan's shared totals are re-used
    block_exclusive_scan2(passes, unused, &total_passes, &unused_total);
    for (int i = 0; i * pass_cap < c; ++i) {
      pass_expert[passes + i] = tid;
      pass_begin[passes + i] = offset + i * pass_cap;
      pass_rows[passes + i] = min(pass_cap, c - i * pass_cap);
    }
    if (tid == 0) *pass_total = total_passes;
  }
  cursor[tid] = offset;
  __syncthreads();
  // Order inside an expert follows atomics: the GEMMs compute each pair's column independently, so the
  // results do not depend on it.
  for (int p = tid; p < pairs; p += kRouteThreads) {
    int e = ids[p];
    if (e >= 0 && e < experts) sorted_pairs[atomicAdd(&cursor[e], 1)] = p;
  }
}

__global__ void __launch_bounds__(kRouteThreads) moe_route_kernel(const int32_t* ids, int pairs, int experts,
                                                                  const PairGroups groups) {
  pdl_wait();  // the top-k ids come from the router
  pdl_launch_dependents();
  group_pairs(ids, pairs, experts, groups);
}

// The router and the grouping in one launch, for a decode step's few tokens: token t's affinities by
// threads [t·256, t·256 + 256), its selection by the first warp of them (router.cuh: route_topk's
// steps, the same bits), then the grouping by the whole block — one dependent launch fewer on the
// decode chain than route_topk followed by moe_route_kernel.
__global__ void __launch_bounds__(kRouteThreads)
    route_group_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                       const int32_t* __restrict__ hash_table, const int32_t* __restrict__ token_ids, int T, int E,
                       int k, float route_scale, int32_t* ids, float* __restrict__ weights, int experts,
                       const PairGroups groups) {
  using namespace router_detail;
  __shared__ float s_aff[kFusedRouteTokens][kMaxExperts];
  __shared__ int32_t s_id[kFusedRouteTokens][kMaxExperts];
  __shared__ float s_bias[kMaxExperts];  // (a weight: loaded before the wait, see token_select)
  // The selection stays in shared memory for the grouping and the normalisation; global memory only
  // receives it. Written to and read back from there, each was an L2 round trip on the decode chain.
  __shared__ int32_t s_ids[kFusedRouteTokens * kMaxK];
  __shared__ float s_weights[kFusedRouteTokens * kMaxK];
  if (bias && int(threadIdx.x) < E) s_bias[threadIdx.x] = bias[threadIdx.x];
  pdl_wait();  // the gate logits
  pdl_launch_dependents();
  const int t = threadIdx.x / kMaxExperts, i = threadIdx.x % kMaxExperts;
  if (t < T) token_affinities(i, logits + int64_t(t) * E, hash_table, token_ids, t, E, k, s_aff[t], s_id[t]);
  __syncthreads();
  if (t < T && i < 32)
    token_select(i, s_aff[t], s_id[t], bias ? s_bias : nullptr, hash_table != nullptr, E, k, route_scale, s_ids + t * k,
                 s_weights + t * k);
  __syncthreads();
  if (int(threadIdx.x) < T * k) {
    ids[threadIdx.x] = s_ids[threadIdx.x];
    weights[threadIdx.x] = s_weights[threadIdx.x];
  }
  group_pairs(s_ids, T * k, experts, groups);
}

// Adds 8 bf16 channels to sum.
__device__ __forceinline__ void add_bf16x8(float (&sum)[8], const uint4& v) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    sum[2 * i] += f.x;
    sum[2 * i + 1] += f.y;
  }
}

// The order in which one token's pairs are summed (by expert id, then j): order[r] = the r-th pair's
// j, −1 past the pairs whose ids lie in [0, experts).
template <int kK>
__device__ __forceinline__ void pair_order(const int32_t* ids, int k, int experts, int (&order)[kK]) {
  int key[kK];  // id·kK + j, INT_MAX for pairs outside [0, E)
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    const int e = j < k ? __ldg(&ids[j]) : -1;
    key[j] = e >= 0 && e < experts ? e * kK + j : INT_MAX;
  }
  // Rank of each pair = number of smaller keys (keys are unique): slot r holds the r-th pair.
#pragma unroll
  for (int r = 0; r < kK; ++r) order[r] = -1;
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    int rank = 0;
#pragma unroll
    for (int i = 0; i < kK; ++i) rank += key[i] < key[j];
#pragma unroll
    for (int r = 0; r < kK; ++r)
      if (r == rank && key[j] != INT_MAX) order[r] = j;
  }
}

__device__ __forceinline__ uint4 pack_bf16x8(const float (&sum)[8]) {
  uint4 o;
  __nv_bfloat162* ho = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
  for (int i = 0; i < 4; ++i) ho[i] = __floats2bfloat162_rn(sum[2 * i], sum[2 * i + 1]);
  return o;
}

// One thread = 8 channels of one token. The pairs' order is settled first, then all their loads go
// out together: one memory latency instead of one per expert.
template <int kK>
__global__ void moe_combine_kernel(const __nv_bfloat16* expert_out, const int32_t* ids, int k, int experts, int hidden,
                                   const __nv_bfloat16* shared, __nv_bfloat16* out) {
  pdl_wait();  // the down GEMM's expert outputs
  pdl_launch_dependents();
  const int t = blockIdx.y;
  const int c0 = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (c0 >= hidden) return;
  int order[kK];
  pair_order(ids + size_t(t) * k, k, experts, order);
  uint4 v[kK];
#pragma unroll
  for (int r = 0; r < kK; ++r)
    v[r] = order[r] >= 0 ? __ldg(reinterpret_cast<const uint4*>(expert_out + (size_t(t) * k + order[r]) * hidden + c0))
                         : make_uint4(0, 0, 0, 0);
  const uint4 sv = shared ? __ldg(reinterpret_cast<const uint4*>(shared + size_t(t) * hidden + c0)) : make_uint4(0, 0, 0, 0);
  float sum[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int r = 0; r < kK; ++r)
    if (order[r] >= 0) add_bf16x8(sum, v[r]);
  if (shared) add_bf16x8(sum, sv);
  *reinterpret_cast<uint4*>(out + size_t(t) * hidden + c0) = pack_bf16x8(sum);
}

// Adds 8 f32 channels, each rounded to bf16 first (an expert output's rounding in the reference).
__device__ __forceinline__ void add_rounded_f32x8(float (&sum)[8], const float* p) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p + 4));
  const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) sum[i] += __bfloat162float(__float2bfloat16_rn(v[i]));
}

// moe_combine over summed f32 partials [tokens, k + 1, hidden]: one thread = 8 channels of a token.
template <int kK>
__global__ void moe_combine_partials_kernel(const float* partials, const int32_t* ids, int k, int hidden,
                                            __nv_bfloat16* out) {
  pdl_wait();  // the all-reduce of the partials
  pdl_launch_dependents();
  const int t = blockIdx.x;
  const int c0 = (blockIdx.y * blockDim.x + threadIdx.x) * 8;
  if (c0 >= hidden) return;
  int order[kK];
  pair_order(ids + size_t(t) * k, k, INT_MAX, order);
  const float* row = partials + size_t(t) * (k + 1) * hidden + c0;
  float sum[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int r = 0; r < kK; ++r)
    if (order[r] >= 0) add_rounded_f32x8(sum, row + size_t(order[r]) * hidden);
  add_rounded_f32x8(sum, row + size_t(k) * hidden);
  *reinterpret_cast<uint4*>(out + size_t(t) * hidden + c0) = pack_bf16x8(sum);
}

// Grid (tokens·(k + 1) rows, channel groups of 4): zero the rows of pairs the down GEMM did not write,
// copy the shared expert's row into slot k.
__global__ void moe_partials_finish_kernel(const int32_t* ids, int k, int experts, int hidden, const float* shared,
                                           float* partials) {
  pdl_wait();  // the down GEMM
  pdl_launch_dependents();
  const int row = blockIdx.x, t = row / (k + 1), j = row % (k + 1);
  const int c0 = (blockIdx.y * blockDim.x + threadIdx.x) * 4;
  if (c0 >= hidden) return;
  float4* dst = reinterpret_cast<float4*>(partials + size_t(row) * hidden + c0);
  if (j == k) {
    *dst = shared ? __ldg(reinterpret_cast<const float4*>(shared + size_t(t) * hidden + c0)) : make_float4(0.f, 0.f, 0.f, 0.f);
    return;
  }
  const int e = __ldg(&ids[size_t(t) * k + j]);
  if (e < 0 || e >= experts) *dst = make_float4(0.f, 0.f, 0.f, 0.f);
}

__global__ void moe_local_expert_ids_kernel(const int32_t* ids, int64_t n, int begin, int count, int32_t* out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int e = ids[i] - begin;
  out[i] = e >= 0 && e < count ? e : -1;
}

}  // namespace

void moe_route_pairs(const int32_t* topk_ids, int tokens, int k, int experts, bool with_passes, MoeWorkspace& ws,
                     cudaStream_t stream) {
  if (experts > kRouteThreads) fail("moe_route_pairs: {} experts (at most {})", experts, kRouteThreads);
  launch_programmatic(moe_route_kernel, dim3(1), dim3(kRouteThreads), 0, stream, topk_ids, tokens * k, experts,
                      pair_groups(ws, with_passes ? std::min(kMoeMaxPassRows, tokens) : 0));
}

bool moe_route_topk_pairs(const float* logits, const float* bias, const int32_t* hash_table, const int32_t* token_ids,
                          int tokens, int E, int k, float route_scale, int32_t* ids, float* weights, int experts,
                          bool with_passes, MoeWorkspace& ws, cudaStream_t stream) {
  if (tokens < 1 || tokens > kFusedRouteTokens || E > router_detail::kMaxExperts || experts > kRouteThreads ||
      k > kMaxK || tokens > ws.max_tokens() || k != ws.k())
    return false;
  if (E <= 0 || k <= 0 || k > E || (hash_table && !token_ids))
    fail("moe_route_topk_pairs: E {}, k {}{}", E, k, hash_table && !token_ids ? ", hash routing without token ids" : "");
  launch_programmatic(route_group_kernel, dim3(1), dim3(kRouteThreads), 0, stream, logits, bias, hash_table, token_ids,
                      tokens, E, k, route_scale, ids, weights, experts,
                      pair_groups(ws, with_passes ? std::min(kMoeMaxPassRows, tokens) : 0));
  return true;
}

void moe_combine(const uint16_t* expert_out, const int32_t* topk_ids, int tokens, int k, int experts, int hidden,
                 const uint16_t* shared_or_null, uint16_t* out, cudaStream_t stream) {
  if (k > kMaxK || hidden % 8) fail("moe_combine: k {} (at most {}) / hidden {} (multiple of 8)", k, kMaxK, hidden);
  dim3 grid((hidden / 8 + kCombineThreads - 1) / kCombineThreads, tokens);
  launch_programmatic(combine_width(k) == 8 ? moe_combine_kernel<8> : moe_combine_kernel<kMaxK>, grid,
                      dim3(kCombineThreads), 0, stream,
                      reinterpret_cast<const __nv_bfloat16*>(expert_out), topk_ids, k, experts, hidden,
                      reinterpret_cast<const __nv_bfloat16*>(shared_or_null), reinterpret_cast<__nv_bfloat16*>(out));
}

void moe_partials_finish(const int32_t* topk_ids, int tokens, int k, int experts, int hidden, const float* shared_or_null,
                         float* partials, cudaStream_t stream) {
  if (hidden % 4 || tokens * int64_t(k + 1) > INT_MAX) fail("moe_partials_finish: hidden {} (multiple of 4), {} tokens", hidden, tokens);
  if (tokens <= 0) return;
  dim3 grid(unsigned(tokens * (k + 1)), (hidden / 4 + kCombineThreads - 1) / kCombineThreads);
  launch_programmatic(moe_partials_finish_kernel, grid, dim3(kCombineThreads), 0, stream, topk_ids, k, experts, hidden,
                      shared_or_null, partials);
}

void moe_combine_partials(const float* partials, const int32_t* topk_ids, int tokens, int k, int hidden, uint16_t* out,
                          cudaStream_t stream) {
  if (k > kMaxK || hidden % 8) fail("moe_combine_partials: k {} (at most {}) / hidden {} (multiple of 8)", k, kMaxK, hidden);
  if (tokens <= 0) return;
  dim3 grid(unsigned(tokens), (hidden / 8 + kCombineThreads - 1) / kCombineThreads);
  launch_programmatic(combine_width(k) == 8 ? moe_combine_partials_kernel<8> : moe_combine_partials_kernel<kMaxK>, grid,
                      dim3(kCombineThreads), 0, stream, partials, topk_ids, k, hidden, reinterpret_cast<__nv_bfloat16*>(out));
}

void moe_local_expert_ids(const int32_t* ids, int64_t n, int begin, int count, int32_t* out, cudaStream_t stream) {
  if (n <= 0) return;
  launch_programmatic(moe_local_expert_ids_kernel, dim3(unsigned((n + 255) / 256)), dim3(256), 0, stream, ids, n, begin,
                      count, out);
}

std::vector<KernelLaunch> moe_routing_kernel_launches() {
  return {{"moe_route_kernel", kRouteThreads, 0},
          {"route_group_kernel", kRouteThreads, 0},
          {"moe_combine_kernel<8>", kCombineThreads, 0},
          {"moe_combine_kernel<" + std::to_string(kMaxK) + ">", kCombineThreads, 0},
          {"moe_combine_partials_kernel<8>", kCombineThreads, 0},
          {"moe_combine_partials_kernel<" + std::to_string(kMaxK) + ">", kCombineThreads, 0},
          {"moe_partials_finish_kernel", kCombineThreads, 0},
          {"moe_local_expert_ids_kernel", 256, 0}};
}

}  // namespace dsv4::cuda
