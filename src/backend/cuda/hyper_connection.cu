// Hyper-connection kernels (backend/cuda/hyper_connection.h).
// hc_pre / hc_head: a cluster of blocks per token reads the token's hc·D streams once, each thread
// accumulating all the mixes' partial dot products and the sum of squares; block then cluster
// reductions; then one warp does the per-token scalar work (sigmoids; for hc_pre the Sinkhorn with one
// lane per row / column, in the CPU's order) and the cluster writes x_in. hc_post: a thread per
// (token, channel). Every f32 step the CPU rounds separately is written with the _rn intrinsics (no
// FMA contraction: the CPU build has none), so given the same mixes the outputs are bit-exact; only
// the reductions (double on the CPU) differ in order.
#include "backend/cuda/hyper_connection.h"

#include <cooperative_groups.h>

#include <cstdint>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/quant_math.cuh"
#include "backend/cuda/ptx_primitives.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kClusterBlocks = 8;  // blocks per token in hc_pre / hc_head (the portable cluster size)



// The CPU's sigmoid: 1 / (1 + exp(−z)); expf is within 2 ulp of std::exp.
__device__ __forceinline__ float sigmoid(float z) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-z))); }

// C[a][b] /= (Σ_a C[a][b] + eps) for column b = lane (lanes ≥ hc idle), sums in row order.
template <int HC>
__device__ __forceinline__ void sinkhorn_col_norm(float* C, int lane, float eps) {
  if (lane < HC) {
    float s = 0;
    for (int a = 0; a < HC; ++a) s = __fadd_rn(s, C[a * HC + lane]);
    const float d = __fadd_rn(s, eps);
    for (int a = 0; a < HC; ++a) C[a * HC + lane] = __fdiv_rn(C[a * HC + lane], d);
  }
  __syncwarp();
}

// C[a][b] /= (Σ_b C[a][b] + eps) for row a = lane.
template <int HC>
__device__ __forceinline__ void sinkhorn_row_norm(float* C, int lane, float eps) {
  if (lane < HC) {
    float s = 0;
    for (int b = 0; b < HC; ++b) s = __fadd_rn(s, C[lane * HC + b]);
    const float d = __fadd_rn(s, eps);
    for (int b = 0; b < HC; ++b) C[lane * HC + b] = __fdiv_rn(C[lane * HC + b], d);
  }
  __syncwarp();
}

// pre (and for hc_pre post) of one token from its mixes m, lane j < HC computing stream j (SPEC §3.2).
template <int HC, int NMix>
__device__ __forceinline__ void token_pre_post(const float* m, const float* base, const float* scale, float hc_eps,
                                               int lane, float* pre, float* post_t) {
  if (lane >= HC) return;
  pre[lane] = __fadd_rn(sigmoid(__fadd_rn(__fmul_rn(m[lane], scale[0]), base[lane])), hc_eps);
  if constexpr (NMix > HC)
    post_t[lane] = __fmul_rn(2.0f, sigmoid(__fadd_rn(__fmul_rn(m[HC + lane], scale[1]), base[HC + lane])));
}

// comb of one token (hc_pre): row softmax + eps, a column normalisation, then (iters − 1) × (row,
// column), one lane per row / column, each step in the CPU's order. Called by a whole warp.
template <int HC>
__device__ __forceinline__ void token_comb(const float* m, const float* base, const float* scale, int iters,
                                           float hc_eps, int lane, float* C, float* comb_t) {
  if (lane < HC) {
    float* row = C + lane * HC;
    float mx = -INFINITY;
    for (int b = 0; b < HC; ++b) {
      const int j = 2 * HC + lane * HC + b;
      row[b] = __fadd_rn(__fmul_rn(m[j], scale[2]), base[j]);
      mx = fmaxf(mx, row[b]);
    }
    float s = 0;
    for (int b = 0; b < HC; ++b) s = __fadd_rn(s, row[b] = expf(__fsub_rn(row[b], mx)));
    for (int b = 0; b < HC; ++b) row[b] = __fadd_rn(__fdiv_rn(row[b], s), hc_eps);
  }
  __syncwarp();
  sinkhorn_col_norm<HC>(C, lane, hc_eps);
  for (int it = 1; it < iters; ++it) {
    sinkhorn_row_norm<HC>(C, lane, hc_eps);
    sinkhorn_col_norm<HC>(C, lane, hc_eps);
  }
  if (lane < HC)
    for (int b = 0; b < HC; ++b) comb_t[lane * HC + b] = C[lane * HC + b];
}

// One token per cluster of kClusterBlocks blocks (so a decode step's few tokens still spread the
// 24 × 16384 f32 weights over many SMs). NMix = (2+HC)·HC for hc_pre (pre, post, comb), HC for hc_head
// (pre only). Block `rank` of the cluster takes the float4 chunks q ≡ rank·kThreads + tid (mod
// kClusterBlocks·kThreads) of the token's hc·D channels; rank 0 adds the blocks' partial sums in rank
// order (distributed shared memory), does the scalar work and hands pre back to every block, which
// then writes its share of x_in.
template <int HC, int NMix>
__global__ void __cluster_dims__(kClusterBlocks, 1, 1) __launch_bounds__(kThreads)
    hc_mix_kernel(const uint16_t* __restrict__ X, int D, const float* __restrict__ fn,
                  const float* __restrict__ base, const float* __restrict__ scale, int iters, float norm_eps,
                  float hc_eps, uint16_t* __restrict__ out, float* __restrict__ post, float* __restrict__ comb) {
  constexpr bool kFull = NMix > HC;
  __shared__ float warp_partial[NMix + 1][kWarps];  // [j][warp]: mixes, then the sum of squares
  __shared__ float block_partial[NMix + 1];
  __shared__ float mix[NMix];  // m_j = (v · fn_j) · rs
  __shared__ float pre[HC];
  __shared__ float C[HC * HC];
  pdl_wait();
  pdl_launch_dependents();
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank());
  const int64_t t = blockIdx.x / kClusterBlocks;
  const int width = HC * D;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint16_t* xt = X + t * width;  // the concatenated streams, stream-major (SPEC §3.2)

  float acc[NMix], ss = 0;
#pragma unroll
  for (int j = 0; j < NMix; ++j) acc[j] = 0;
  const int chunks = width / 4;
  for (int q = rank * kThreads + threadIdx.x; q < chunks; q += kClusterBlocks * kThreads) {
    const uint2 raw = reinterpret_cast<const uint2*>(xt)[q];
    const float v[4] = {__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xffff0000u),
                        __uint_as_float(raw.y << 16), __uint_as_float(raw.y & 0xffff0000u)};
#pragma unroll
    for (int k = 0; k < 4; ++k) ss = fmaf(v[k], v[k], ss);
#pragma unroll
    for (int j = 0; j < NMix; ++j) {
      const float4 f = reinterpret_cast<const float4*>(fn + int64_t(j) * width)[q];
      acc[j] = fmaf(v[0], f.x, fmaf(v[1], f.y, fmaf(v[2], f.z, fmaf(v[3], f.w, acc[j]))));
    }
  }
#pragma unroll
  for (int j = 0; j < NMix; ++j) acc[j] = warp_sum(acc[j]);
  ss = warp_sum(ss);
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < NMix; ++j) warp_partial[j][warp] = acc[j];
    warp_partial[NMix][warp] = ss;
  }
  __syncthreads();
  if (threadIdx.x <= NMix) {
    float s = 0;
    for (int w = 0; w < kWarps; ++w) s += warp_partial[threadIdx.x][w];
    block_partial[threadIdx.x] = s;
  }
  cluster.sync();  // every block's partial sums are visible to rank 0

  if (rank == 0) {
    if (threadIdx.x < NMix) {
      // Every thread adds the blocks' sums of squares in the same order, so all see the same rs.
      float s = 0, sq = 0;
      for (int r = 0; r < kClusterBlocks; ++r) {
        const float* partial = cluster.map_shared_rank(block_partial, r);
        s += partial[threadIdx.x];
        sq += partial[NMix];
      }
      // rs and m as hc_mixes: the CPU divides its double sum by the width in double, rounds to f32.
      const float rs = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(float(double(sq) / double(width)), norm_eps)));
      mix[threadIdx.x] = __fmul_rn(s, rs);
    }
    __syncthreads();
    if (warp == 0) token_pre_post<HC, NMix>(mix, base, scale, hc_eps, lane, pre, kFull ? post + t * HC : nullptr);
  }
  cluster.sync();  // rank 0's pre is ready
  if (rank != 0 && threadIdx.x < HC) pre[threadIdx.x] = cluster.map_shared_rank(pre, 0)[threadIdx.x];
  cluster.sync();  // no block leaves while another still reads its shared memory

  // x_in = bf(Σ_j pre[j]·X[j]), accumulated from 0 in stream order as the CPU.
  for (int d = rank * kThreads + threadIdx.x; d < D; d += kClusterBlocks * kThreads) {
    float a = 0;
#pragma unroll
    for (int j = 0; j < HC; ++j) a = __fadd_rn(a, __fmul_rn(pre[j], bf16_value(xt[j * D + d])));
    out[t * D + d] = bf16_bits(a);
  }
  // The Sinkhorn last, when nothing else is left to do: the x_in loop's state is then no longer live
  // across the division calls (which otherwise made ptxas spill on sm_120).
  if constexpr (kFull)
    if (rank == 0 && warp == 0) token_comb<HC>(mix, base, scale, iters, hc_eps, lane, C, comb + t * HC * HC);
}

// A thread per (token, channel d): blocks_per_token blocks of kThreads channels per token, so one
// decode token still spreads over several SMs. The thread reads X[t, ·, d] and writes out[t, ·, d],
// nothing else, so out may alias X (hence no __restrict__ on them).
template <int HC>
__global__ void __launch_bounds__(kThreads) hc_post_kernel(const uint16_t* __restrict__ y, const uint16_t* X,
                                                           const float* __restrict__ post,
                                                           const float* __restrict__ comb, int D,
                                                           int blocks_per_token, uint16_t* out) {
  __shared__ float p[HC], C[HC * HC];
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x / blocks_per_token;
  const int d = (blockIdx.x % blocks_per_token) * kThreads + threadIdx.x;
  if (threadIdx.x < HC) p[threadIdx.x] = post[t * HC + threadIdx.x];
  if (threadIdx.x < HC * HC) C[threadIdx.x] = comb[t * HC * HC + threadIdx.x];
  __syncthreads();
  if (d >= D) return;
  const uint16_t* xt = X + t * HC * D;
  uint16_t* ot = out + t * HC * D;
  float x[HC];
#pragma unroll
  for (int a = 0; a < HC; ++a) x[a] = bf16_value(xt[a * D + d]);
  const float yd = bf16_value(y[t * D + d]);
#pragma unroll
  for (int b = 0; b < HC; ++b) {
    float mixed = 0;
#pragma unroll
    for (int a = 0; a < HC; ++a) mixed = __fadd_rn(mixed, __fmul_rn(C[a * HC + b], x[a]));
    ot[b * D + d] = bf16_bits(__fadd_rn(__fmul_rn(p[b], yd), mixed));
  }
}

void check_shape(const char* op, int64_t T, int hc, int D) {
  if (hc < 1 || hc > 4 || D <= 0 || T > 0x7fffffff || int64_t(hc) * D > 0x7fffffff)
    fail("{}: T {} hc {} D {} (hc must be 1…4)", op, T, hc, D);
}

// The mix kernels read X in 4-channel (8-byte) and fn in 4-weight (16-byte) vectors. They are built
// for hc = 4 only (DeepSeek-V4): other stream counts are supported by hc_post alone, because with
// sm_120's ptxas some of the other instantiations spill a register around the Sinkhorn's IEEE
// division calls (a build error under -warn-spills).
void check_mix_operands(const char* op, int64_t T, int hc, int D, const uint16_t* X, const float* fn) {
  if (hc != 4) fail("{}: hc {} (the mix kernels are built for hc = 4)", op, hc);
  if (D % 4 || reinterpret_cast<uintptr_t>(X) % 8 || reinterpret_cast<uintptr_t>(fn) % 16)
    fail("{}: D {} must be a multiple of 4, X 8-byte and fn 16-byte aligned", op, D);
  if (T * kClusterBlocks > 0x7fffffff) fail("{}: {} tokens exceed the grid", op, T);
}

template <int HC>
void launch_hc_pre(const uint16_t* X, int64_t T, int D, const float* fn, const float* base, const float* scale,
                   int iters, float norm_eps, float hc_eps, uint16_t* out, float* post, float* comb,
                   cudaStream_t stream) {
  launch_programmatic(hc_mix_kernel<HC, (2 + HC) * HC>, dim3(unsigned(T * kClusterBlocks)), dim3(kThreads), 0,
                      stream, X, D, fn, base, scale, iters, norm_eps, hc_eps, out, post, comb);
}

template <int HC>
void launch_hc_head(const uint16_t* X, int64_t T, int D, const float* fn, const float* base, const float* scale,
                    float norm_eps, float hc_eps, uint16_t* out, cudaStream_t stream) {
  launch_programmatic(hc_mix_kernel<HC, HC>, dim3(unsigned(T * kClusterBlocks)), dim3(kThreads), 0, stream, X, D,
                      fn, base, scale, 0, norm_eps, hc_eps, out, static_cast<float*>(nullptr),
                      static_cast<float*>(nullptr));
}

template <int HC>
void launch_hc_post(const uint16_t* y, const uint16_t* X, const float* post, const float* comb, int64_t T, int D,
                    uint16_t* out, cudaStream_t stream) {
  const int blocks_per_token = (D + kThreads - 1) / kThreads;
  if (T * blocks_per_token > 0x7fffffff) fail("hc_post: {} tokens of {} exceed the grid", T, D);
  launch_programmatic(hc_post_kernel<HC>, dim3(unsigned(T * blocks_per_token)), dim3(kThreads), 0, stream, y, X,
                      post, comb, D, blocks_per_token, out);
}

}  // namespace

void hc_pre(const uint16_t* X, int64_t T, int hc, int D, const float* fn, const float* base, const float* scale,
            int iters, float norm_eps, float hc_eps, uint16_t* out, float* post, float* comb, cudaStream_t stream) {
  check_shape("hc_pre", T, hc, D);
  check_mix_operands("hc_pre", T, hc, D, X, fn);
  if (T == 0) return;
  launch_hc_pre<4>(X, T, D, fn, base, scale, iters, norm_eps, hc_eps, out, post, comb, stream);
}

void hc_post(const uint16_t* y, const uint16_t* X, const float* post, const float* comb, int64_t T, int hc, int D,
             uint16_t* out, cudaStream_t stream) {
  check_shape("hc_post", T, hc, D);
  if (T == 0) return;
  switch (hc) {
    case 1: return launch_hc_post<1>(y, X, post, comb, T, D, out, stream);
    case 2: return launch_hc_post<2>(y, X, post, comb, T, D, out, stream);
    case 3: return launch_hc_post<3>(y, X, post, comb, T, D, out, stream);
    default: return launch_hc_post<4>(y, X, post, comb, T, D, out, stream);
  }
}

void hc_head(const uint16_t* X, int64_t T, int hc, int D, const float* fn, const float* base, const float* scale,
             float norm_eps, float hc_eps, uint16_t* out, cudaStream_t stream) {
  check_shape("hc_head", T, hc, D);
  check_mix_operands("hc_head", T, hc, D, X, fn);
  if (T == 0) return;
  launch_hc_head<4>(X, T, D, fn, base, scale, norm_eps, hc_eps, out, stream);
}

}  // namespace dsv4::cuda
