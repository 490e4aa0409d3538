// Hyper-connection kernels (backend/cuda/hyper_connection.h).
// hc_pre / hc_head: two launches (below, before hc_mix_partials_kernel): partial dot products (on the
// tensor cores, f32 weights as three exact bf16 parts) and sums of squares per (token, channel slice),
// then per token their sum in slice order, the per-token scalar work (sigmoids; for hc_pre the
// Sinkhorn with one lane per row / column, in the CPU's order) and x_in; for a decode step's 1–2 rows
// both in one launch (hc_mix_fused_kernel: the last block to finish does the second's work). hc_post:
// a thread per (token, channel). Every f32 step the CPU rounds separately is written with the _rn
// intrinsics (no FMA contraction: the CPU build has none), so given the same mixes the outputs are
// bit-exact; only the reductions (double on the CPU) differ in order and rounding.
#include "backend/cuda/hyper_connection.h"

#include <cstdint>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/quant_math.cuh"
#include "backend/cuda/ptx_primitives.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// The CPU's sigmoid: 1 / (1 + exp(−z)); expf is within 2 ulp of std::exp.
__device__ __forceinline__ float sigmoid(float z) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-z))); }

// Σ_k C[first + k·stride] for k = 0 … HC−1 in that order, each entry from the lane that holds it.
template <int HC>
__device__ __forceinline__ float ordered_lane_sum(float c, int first, int stride) {
  float s = 0;
#pragma unroll
  for (int k = 0; k < HC; ++k) s = __fadd_rn(s, __shfl_sync(0xffffffffu, c, first + k * stride));
  return s;
}

// pre (and, given post_t, post) of one token from its mixes m, lane j < HC computing stream j (SPEC §3.2).
template <int HC>
__device__ __forceinline__ void token_pre_post(const float* m, const float* base, const float* scale, float hc_eps,
                                               int lane, float* pre, float* post_t) {
  if (lane >= HC) return;
  pre[lane] = __fadd_rn(sigmoid(__fadd_rn(__fmul_rn(m[lane], scale[0]), base[lane])), hc_eps);
  if (post_t)
    post_t[lane] = __fmul_rn(2.0f, sigmoid(__fadd_rn(__fmul_rn(m[HC + lane], scale[1]), base[HC + lane])));
}

// comb of one token (hc_pre): row softmax + eps, a column normalisation, then (iters − 1) × (row,
// column), each step in the CPU's order. Called by a whole warp; lane a·HC + b holds C[a][b] in a
// register and gathers its row's or column's entries by shuffles (no shared memory, no barriers:
// this is the decode step's one serial stretch).
template <int HC>
__device__ __forceinline__ void token_comb(const float* m, const float* base, const float* scale, int iters,
                                           float hc_eps, int lane, float* comb_t) {
  static_assert(HC * HC <= 32, "a lane per entry");
  const int l = lane % (HC * HC), a = l / HC, b = l % HC;  // lanes ≥ HC·HC mirror lanes < HC·HC
  const int j = 2 * HC + l;
  float c = __fadd_rn(__fmul_rn(m[j], scale[2]), base[j]);
  float mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < HC; ++k) mx = fmaxf(mx, __shfl_sync(0xffffffffu, c, a * HC + k));
  c = expf(__fsub_rn(c, mx));
  c = __fadd_rn(__fdiv_rn(c, ordered_lane_sum<HC>(c, a * HC, 1)), hc_eps);
  c = __fdiv_rn(c, __fadd_rn(ordered_lane_sum<HC>(c, b, HC), hc_eps));
  for (int it = 1; it < iters; ++it) {
    c = __fdiv_rn(c, __fadd_rn(ordered_lane_sum<HC>(c, a * HC, 1), hc_eps));
    c = __fdiv_rn(c, __fadd_rn(ordered_lane_sum<HC>(c, b, HC), hc_eps));
  }
  if (lane < HC * HC) comb_t[lane] = c;
}

// The mixes in two launches, so that a decode step's one token still spreads the 24 × 16384 f32
// weights over many SMs and a prefill chunk's thousands of tokens share each weight load:
//  1. the partial sums of each token's slices of kSliceChunks float4 chunks of the hc·D channels: its
//     NMix dot products and its sum of squares, to partials[t][s][·]. A prefill chunk's tokens:
//     hc_mix_partials_kernel, block (s, g) the slice s of kMixWarps tiles of 16 tokens, a warp each,
//     the slice's weights waiting in shared memory as the tensor cores take them; a decode batch's:
//     hc_mix_pair_partials_kernel, a block per slice and 16-row tile, its warps sharing the k-steps.
//  2. hc_mix_finish_kernel: blocks_per_token blocks per token add the slices' partials of pre and of
//     the sum of squares (a fixed order), scale by rs and write their share of x_in; for hc_pre, after
//     them, a warp per token adds all the sums the same way and does the post mixes and the Sinkhorn.
// A token's arithmetic depends only on its own channels and the fixed slices, never on T or on the
// token's place in a tile: a row's result is the same alone and in any batch.
//
// A slice's sums, in every kernel that makes them (the tensor cores: the f32 FMA forms these replace
// were bound by their weight loads, 452 µs for the 24 mixes of 8,192 tokens on an H100 where the
// streams' bytes take ~90; docs/perf/2026-12-07-hc-mix-mma.md):
//  - The channels of a slice are 8 pairs p of 32; in pair p, piece q is channels 32p + 8q … + 7, and
//    its halves h = 0, 1 (4 channels each) belong to k-step ks = 2p + h of an m16n8k16 product. The
//    lane whose threadID in its group of 4 is q holds piece q: its k positions 2q, 2q+1, 2q+8, 2q+9
//    are the half's 4 channels in order, in the A (streams) and B (weights) fragments alike.
//  - fn is f32 and the products bf16: each weight enters as three bf16 parts hi + mid + lo that add
//    up to it exactly (8 + 8 + 8 bits), and each stream value is a bf16 already, so every product is
//    exact and only the sums round (the tensor cores' f32 sums). Per k-step and 8 mixes j:
//    r[ks][j] = mma(hi, mma(mid, mma(lo, 0))), and partial = r[0] + r[1] + … + r[15] in that order.
//  - The sum of squares: ss_pq = the piece's 8 squares by fma in channel order, a_q = the pairs'
//    pairwise tree ((ss_0q + ss_1q) + (ss_2q + ss_3q)) + ((ss_4q + ss_5q) + (ss_6q + ss_7q)), and
//    ss = (a_0 + a_1) + (a_2 + a_3).
// A tensor-core sum's bits depend on its row's operands only (not on the tile's other rows: the
// batch-invariance tests compare a row alone with the same row at other places of a tile).
constexpr int kSliceChunks = 64;  // 256 channels
constexpr int kSlicePairs = 8, kSliceSteps = 2 * kSlicePairs;
constexpr int kMixWarps = 4;  // a partials block's 16-token tiles
constexpr int kMixThreads = 32 * kMixWarps;
constexpr int kFinishChannels = kThreads * 4;  // x_in channels per finishing block
constexpr int kMaxNormWidth = 8192;            // D of a finishing block that also applies the norm

// One step of warp_transpose_sum: a lane keeps the half of v[0, 2·Keep) its partner (lane ^ Keep)
// drops and adds the partner's copy of it.
template <int Keep>
__device__ __forceinline__ void transpose_sum_step(float (&v)[32], int lane) {
  const bool upper = lane & Keep;
#pragma unroll
  for (int i = 0; i < Keep; ++i) {
    const float send = upper ? v[i] : v[i + Keep];
    const float mine = upper ? v[i + Keep] : v[i];
    v[i] = mine + __shfl_xor_sync(0xffffffffu, send, Keep);
  }
}

// v[i] summed over the warp's lanes for i < 32, in 31 shuffles: lane l ends with Σ v[l] in v[0].
// (Steps as template arguments: each one's loop has a constant count, so v stays in registers.)
__device__ __forceinline__ float warp_transpose_sum(float (&v)[32], int lane) {
  transpose_sum_step<16>(v, lane);
  transpose_sum_step<8>(v, lane);
  transpose_sum_step<4>(v, lane);
  transpose_sum_step<2>(v, lane);
  transpose_sum_step<1>(v, lane);
  return v[0];
}

// hc_post fused ahead of the mixes (hc_post_pre): the stream state the mixes read is computed from the
// previous one instead of loaded, out[t,b,d] = bf16(post[t,b]·y[t,d] + Σ_a comb[t,a,b]·X[t,a,d]) with
// hc_post_kernel's operations in its order, and written out for the kernels after (each element by the
// one lane whose chunk holds it). y null: the mixes read X itself.
struct PostSource {
  const uint16_t* y;
  const uint16_t* X;
  const float* post;
  const float* comb;
  uint16_t* out;
  int D;
};

// The 4 channels of chunk q (flattened over the hc streams) of token t, as hc_post computes them, written
// out and returned.
template <int HC>
__device__ __forceinline__ uint2 posted_chunk(const PostSource& p, int64_t t, int q) {
  const int c = 4 * q, b = c / p.D, d = c % p.D;
  const uint16_t* xt = p.X + t * HC * p.D + d;
  float x[HC][4];
#pragma unroll
  for (int a = 0; a < HC; ++a) {
    const uint2 raw = *reinterpret_cast<const uint2*>(xt + a * p.D);
    x[a][0] = __uint_as_float(raw.x << 16), x[a][1] = __uint_as_float(raw.x & 0xffff0000u);
    x[a][2] = __uint_as_float(raw.y << 16), x[a][3] = __uint_as_float(raw.y & 0xffff0000u);
  }
  const uint2 yr = *reinterpret_cast<const uint2*>(p.y + t * p.D + d);
  const float y[4] = {__uint_as_float(yr.x << 16), __uint_as_float(yr.x & 0xffff0000u), __uint_as_float(yr.y << 16),
                      __uint_as_float(yr.y & 0xffff0000u)};
  const float pb = p.post[t * HC + b];
  uint16_t h[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float mixed = 0;
#pragma unroll
    for (int a = 0; a < HC; ++a) mixed = __fadd_rn(mixed, __fmul_rn(p.comb[(t * HC + a) * HC + b], x[a][e]));
    h[e] = bf16_bits(__fadd_rn(__fmul_rn(pb, y[e]), mixed));
  }
  const uint2 v = make_uint2(uint32_t(h[0]) | uint32_t(h[1]) << 16, uint32_t(h[2]) | uint32_t(h[3]) << 16);
  reinterpret_cast<uint2*>(p.out + t * HC * p.D)[q] = v;
  return v;
}

// Chunk q (4 channels) of token t's stream state as bf16 bits: read from X, or with kPost computed from
// the previous state and written out (each chunk by the one lane that computes it).
template <bool kPost>
__device__ __forceinline__ uint2 state_chunk(const uint16_t* X, int width, const PostSource& post, int64_t t, int q) {
  if constexpr (kPost) return posted_chunk<4>(post, t, q);  // the mix kernels are built for hc = 4
  else return reinterpret_cast<const uint2*>(X + t * width)[q];
}

// The B registers of 4 consecutive weights (channels 0, 1 and 2, 3) for each bf16 part: [hi, mid, lo].
struct WeightParts {
  uint32_t b[3][2];
};

// Weights of mix j at float4 chunk q (zeros past the mixes or the channels).
template <int NMix>
__device__ __forceinline__ float4 mix_weights(const float* fn, int width, int j, int q) {
  if (j < NMix && q < width / 4) return reinterpret_cast<const float4*>(fn + int64_t(j) * width)[q];
  return make_float4(0, 0, 0, 0);
}

// 4 weights split into their parts.
__device__ __forceinline__ WeightParts weight_parts(float4 f) {
  const float v[4] = {f.x, f.y, f.z, f.w};
  uint16_t part[3][4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float rest = v[e];  // (each difference is exact: the parts add up to v)
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      part[k][e] = bf16_bits(rest);
      rest = __fsub_rn(rest, bf16_value(part[k][e]));
    }
  }
  WeightParts w;
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    w.b[k][0] = uint32_t(part[k][0]) | uint32_t(part[k][1]) << 16;
    w.b[k][1] = uint32_t(part[k][2]) | uint32_t(part[k][3]) << 16;
  }
  return w;
}

// r[j] = one k-step's sums of mixes 8j … 8j+7: lo, then mid, then hi (the small parts first).
template <int NT>
__device__ __forceinline__ void mix_step(float (&r)[NT][4], const uint32_t (&a)[4], const WeightParts (&w)[NT]) {
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) r[j][e] = 0;
#pragma unroll
    for (int k = 2; k >= 0; --k) mma_bf16(r[j], a, w[j].b[k][0], w[j].b[k][1]);
  }
}

// ss_pq of a piece: its halves' 8 squares in channel order.
__device__ __forceinline__ float piece_squares(uint2 h0, uint2 h1) {
  return add_squares8(make_uint4(h0.x, h0.y, h1.x, h1.y), 0.0f);
}
// a_q from the 8 pairs' ss_pq.
__device__ __forceinline__ float pair_tree(const float (&s)[kSlicePairs]) {
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// The float4 chunk where the lane's piece (pair p, piece q) starts in slice s.
__device__ __forceinline__ int piece_chunk(int s, int p, int q) { return s * kSliceChunks + p * 8 + 2 * q; }

// A prefill chunk's rows (more than kPairRows): block (s, y) takes slice s for groups_per_block groups of
// kMixWarps · 16 tokens, a warp a 16-token tile (rows g and g + 8 of lane (g, q) = (lane / 4, lane % 4)).
// The slice's weight parts are laid out in shared memory as the lanes read them ([tile of mixes]
// [k-step][part][lane], 8 bytes a lane: no bank conflicts), before the programmatic wait: they do not
// depend on the kernels before.
template <int NMix>
__global__ void __launch_bounds__(kMixThreads)
    hc_mix_partials_kernel(const uint16_t* __restrict__ X, int64_t T, int width, const float* __restrict__ fn,
                           int slices, int groups_per_block, float* __restrict__ partials) {
  constexpr int NT = (NMix + 7) / 8, NV = NMix + 1;
  __shared__ uint2 parts[NT][kSliceSteps][3][32];
  const int s = blockIdx.x, chunks = width / 4;
  for (int i = threadIdx.x; i < NT * kSliceSteps * 32; i += kMixThreads) {
    const int l = i % 32, ks = i / 32 % kSliceSteps, j = i / (32 * kSliceSteps);
    const WeightParts w = weight_parts(mix_weights<NMix>(fn, width, 8 * j + l / 4, piece_chunk(s, ks / 2, l % 4) + ks % 2));
#pragma unroll
    for (int k = 0; k < 3; ++k) parts[j][ks][k][l] = make_uint2(w.b[k][0], w.b[k][1]);
  }
  __syncthreads();
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  for (int group = 0; group < groups_per_block; ++group) {
    const int64_t t0 = ((int64_t(blockIdx.y) * groups_per_block + group) * kMixWarps + warp) * 16;
    if (t0 >= T) return;
    const int64_t rows[2] = {t0 + g, t0 + g + 8};
    // All the tile's loads first (8 pairs × 2 rows × 2 halves, 8 bytes each), then the products.
    uint2 x[kSlicePairs][2][2];
#pragma unroll
    for (int p = 0; p < kSlicePairs; ++p)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int c = piece_chunk(s, p, q) + h;
          x[p][r][h] = rows[r] < T && c < chunks ? state_chunk<false>(X, width, {}, rows[r], c) : make_uint2(0, 0);
        }
    float acc[NT][4], ss[2][kSlicePairs];
#pragma unroll
    for (int p = 0; p < kSlicePairs; ++p) {
#pragma unroll
      for (int r = 0; r < 2; ++r) ss[r][p] = piece_squares(x[p][r][0], x[p][r][1]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int ks = 2 * p + h;
        const uint32_t a[4] = {x[p][0][h].x, x[p][1][h].x, x[p][0][h].y, x[p][1][h].y};
        WeightParts w[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int k = 0; k < 3; ++k) {
            const uint2 b = parts[j][ks][k][lane];
            w[j].b[k][0] = b.x, w[j].b[k][1] = b.y;
          }
        float r[NT][4];
        mix_step(r, a, w);
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[j][e] = ks == 0 ? r[j][e] : __fadd_rn(acc[j][e], r[j][e]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float a = pair_tree(ss[r]);
      a = a + __shfl_xor_sync(0xffffffffu, a, 1);  // (a_q + a_q^1): the same bits in both lanes
      a = a + __shfl_xor_sync(0xffffffffu, a, 2);
      if (rows[r] >= T) continue;
      float* out = partials + (rows[r] * slices + s) * NV;
      if (q == 0) out[NMix] = a;
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (8 * j + 2 * q + e < NMix) out[8 * j + 2 * q + e] = acc[j][2 * r + e];
    }
  }
}

// Sum j of a token over its slices, by a whole warp: lane l adds slices l, l + 32, … in order, then
// the lanes in a fixed tree (no serial chain of dependent loads). Every block that needs sum j gets
// the same bits (the comb warps' transposing sum pairs the lanes the same way).
// kL2: partials that other blocks of the caller's own grid wrote, read through L2.
template <bool kL2>
__device__ __forceinline__ float partial_at(const float* p) {
  return kL2 ? __ldcg(p) : *p;
}

template <int NV, bool kL2 = false>
__device__ __forceinline__ float slice_sum(const float* token_partials, int slices, int j, int lane) {
  float s = 0;
  for (int k = lane; k < slices; k += 32) s += partial_at<kL2>(token_partials + k * NV + j);
  return warp_sum(s);
}

// A token's post mixes and Sinkhorn (hc_pre), by one warp from its partial sums: all NV sums at once,
// each lane's in slice_sum's order, then the lanes in the same tree (the transposing sum pairs lanes
// l ^ 16, l ^ 8, … as warp_sum does), ending with sum j in lane j; mix (shared, NMix floats) and pre
// (shared, HC floats) are the warp's scratch.
template <int HC, int NMix, bool kL2>
__device__ __forceinline__ void token_post_comb(const float* tp, int slices, int width, float norm_eps,
                                                const float* base, const float* scale, int iters, float hc_eps,
                                                int lane, float* mix, float* pre, float* post_t, float* comb_t) {
  constexpr int NV = NMix + 1;
  float v[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) v[j] = 0;
  for (int k = lane; k < slices; k += 32)
#pragma unroll
    for (int j = 0; j < NV; ++j) v[j] += partial_at<kL2>(tp + k * NV + j);
  const float sum = warp_transpose_sum(v, lane);
  const float rs = rms_inverse(__shfl_sync(0xffffffffu, sum, NMix), width, norm_eps);
  if (lane < NMix) mix[lane] = __fmul_rn(sum, rs);
  __syncwarp();
  token_pre_post<HC>(mix, base, scale, hc_eps, lane, pre, post_t);
  token_comb<HC>(mix, base, scale, iters, hc_eps, lane, comb_t);
}


// x_in = bf(Σ_j pre[j]·X[j]) of one token, accumulated from 0 in stream order as the CPU; 4 channels
// a thread, the block being the part-th of blocks_per_token.
template <int HC>
__device__ __forceinline__ void x_in_plain(const uint16_t* xt, const float* pre, int D, int part,
                                           int blocks_per_token, uint16_t* yt) {
  for (int d = part * kFinishChannels + threadIdx.x * 4; d < D; d += blocks_per_token * kFinishChannels) {
    float a[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < HC; ++j) {
      const uint2 raw = *reinterpret_cast<const uint2*>(xt + j * D + d);
      const float x[4] = {__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xffff0000u),
                          __uint_as_float(raw.y << 16), __uint_as_float(raw.y & 0xffff0000u)};
#pragma unroll
      for (int e = 0; e < 4; ++e) a[e] = __fadd_rn(a[e], __fmul_rn(pre[j], x[e]));
    }
    *reinterpret_cast<uint2*>(yt + d) = make_uint2(uint32_t(bf16_bits(a[0])) | uint32_t(bf16_bits(a[1])) << 16,
                                                   uint32_t(bf16_bits(a[2])) | uint32_t(bf16_bits(a[3])) << 16);
  }
}

// out = rms_norm(x_in, norm) of one token by its one finishing block, in row_ops.cu rms_norm_kernel's
// order: thread i takes the 8-channel chunks i, i + kThreads, … (x_in rounded to bf16, kept in shared
// memory), sums their squares in that order, then block_sum — the bits of x_in then the rms_norm op.
// The thread's chunks of X and of the norm weight are loaded into registers first (NormedRows::load,
// the weight before the programmatic-launch wait), so that the block waits one memory round trip for
// them, beside the one for the partial sums, instead of one after the other.
constexpr int kNormChunks = kMaxNormWidth / 8 / kThreads;  // a thread's 8-channel chunks at most
constexpr int kDecodeNormChunks = 2;  // the decode form's chunks a thread up to D = 4096 (Flash)
template <int HC, int kChunks = kNormChunks>
struct NormedRows {
  uint4 x[kChunks][HC], w[kChunks];
  __device__ __forceinline__ void load_weight(const uint16_t* norm, int D) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = threadIdx.x + i * kThreads;
      if (c < D / 8) w[i] = reinterpret_cast<const uint4*>(norm)[c];
    }
  }
  // kL2: streams other blocks of this grid wrote, read through L2.
  template <bool kL2 = false>
  __device__ __forceinline__ void load_streams(const uint16_t* xt, int D) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = threadIdx.x + i * kThreads;
#pragma unroll
      for (int j = 0; j < HC; ++j)
        if (c < D / 8) {
          const uint4* p = reinterpret_cast<const uint4*>(xt + j * D) + c;
          x[i][j] = kL2 ? __ldcg(p) : *p;
        }
    }
  }
};

// `sum` is the sum over the kThreads threads that call it (block_sum, or the fused form's named barrier).
// quant (q not null; D a multiple of 256, so every chunk step takes whole warps): the normed row's
// act_quant_fp8 beside it, row t's codes at q + t·D (q, scales and values already at row t).
template <int HC, int kChunks, typename Sum>
__device__ __forceinline__ void x_in_normed(const NormedRows<HC, kChunks>& rows, const float* pre, int D, float norm_eps,
                                            uint16_t* yt, const Fp8Rows& quant, Sum sum) {
  __shared__ uint4 x_in[kMaxNormWidth / 8];
  float ss = 0;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = threadIdx.x + i * kThreads;
    if (c >= D / 8) break;
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < HC; ++j) {
      const uint4 raw = rows.x[i][j];
      const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        a[2 * k] = __fadd_rn(a[2 * k], __fmul_rn(pre[j], __uint_as_float(w[k] << 16)));
        a[2 * k + 1] = __fadd_rn(a[2 * k + 1], __fmul_rn(pre[j], __uint_as_float(w[k] & 0xffff0000u)));
      }
    }
    uint32_t packed[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) packed[k] = uint32_t(bf16_bits(a[2 * k])) | uint32_t(bf16_bits(a[2 * k + 1])) << 16;
    const uint4 chunk = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    x_in[c] = chunk;
    ss = add_squares8(chunk, ss);
  }
  const float rs = rms_inverse(sum(ss), D, norm_eps);  // (the sum's barrier also publishes x_in)
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = threadIdx.x + i * kThreads;
    if (c >= D / 8) break;
    const uint4 y = rms_scale8(x_in[c], rows.w[i], rs);
    reinterpret_cast<uint4*>(yt)[c] = y;
    if (quant.q) act_quant_half_warp8(y, quant.q + 8 * c, quant.scales + c / 16, quant.values ? quant.values + 8 * c : nullptr);
  }
}

// quant's row t.
__device__ __forceinline__ Fp8Rows quant_row(const Fp8Rows& quant, int64_t t, int D) {
  if (!quant.q) return quant;
  return {quant.q + t * D, quant.scales + t * (D / 128), quant.values ? quant.values + t * D : nullptr};
}

// NMix = (2+HC)·HC for hc_pre (pre, post, comb), HC for hc_head (pre only). Blocks [0, T·blocks_per_token):
// x_in, blocks_per_token per token, from the pre sums and the sum of squares only (kNorm: one block
// per token, which also applies the norm). For hc_pre the blocks after them: a warp per token for post
// and the Sinkhorn (the step's one serial stretch, side by side with the x_in blocks).
template <int HC, int NMix, bool kNorm, int kRowChunks = kNormChunks>
__global__ void __launch_bounds__(kThreads)
    hc_mix_finish_kernel(const uint16_t* __restrict__ X, int64_t T, int D, const float* __restrict__ partials,
                         int slices, const float* __restrict__ base, const float* __restrict__ scale, int iters,
                         float norm_eps, float hc_eps, int blocks_per_token, const uint16_t* __restrict__ norm,
                         uint16_t* __restrict__ out, float* __restrict__ post, float* __restrict__ comb,
                         const Fp8Rows quant) {
  constexpr int NV = NMix + 1;
  __shared__ float sums[HC + 1];
  __shared__ float mix[kWarps][NMix];  // m_j = (v · fn_j) · rs
  __shared__ float pre[kWarps][HC];
  const int64_t x_blocks = T * blocks_per_token;
  NormedRows<HC, kRowChunks> rows;
  if constexpr (kNorm)
    if (blockIdx.x < x_blocks) rows.load_weight(norm, D);
  pdl_wait();
  pdl_launch_dependents();
  if constexpr (kNorm)
    if (blockIdx.x < x_blocks) rows.load_streams(X + int64_t(blockIdx.x) * HC * D, D);  // a block per token
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int width = HC * D;
  if (blockIdx.x >= x_blocks) {
    if constexpr (NMix > HC) {
      const int64_t t = (blockIdx.x - x_blocks) * kWarps + warp;
      if (t >= T) return;
      token_post_comb<HC, NMix, false>(partials + t * slices * NV, slices, width, norm_eps, base, scale, iters, hc_eps,
                                       lane, mix[warp], pre[warp], post + t * HC, comb + t * HC * HC);
    }
    return;
  }
  const int64_t t = blockIdx.x / blocks_per_token;
  const int part = blockIdx.x % blocks_per_token;
  if (warp <= HC) {  // warps 0 … HC−1: the pre sums; warp HC: the sum of squares
    const float sum = slice_sum<NV>(partials + t * slices * NV, slices, warp < HC ? warp : NMix, lane);
    if (lane == 0) sums[warp] = sum;
  }
  __syncthreads();
  if (threadIdx.x < HC) mix[0][threadIdx.x] = __fmul_rn(sums[threadIdx.x], rms_inverse(sums[HC], width, norm_eps));
  __syncwarp();
  if (warp == 0) token_pre_post<HC>(mix[0], base, scale, hc_eps, lane, pre[0], nullptr);
  __syncthreads();
  if constexpr (kNorm)
    x_in_normed<HC>(rows, pre[0], D, norm_eps, out + t * D, quant_row(quant, t, D), [](float v) { return block_sum(v); });
  else x_in_plain<HC>(X + t * width, pre[0], D, part, blocks_per_token, out + t * D);
}

// The decode form: both launches in one, for up to kFusedRows tokens. Block s computes slice s's
// partial sums with the same operations as hc_mix_partials_kernel (warp p the k-steps of pair p for
// the rows at A rows 0 … T − 1, their results added up in shared memory in the partial's order), and
// the last block to finish (a ticket) runs the finishing work: warps 0 … 7 x_in (and the norm) token
// by token as the finishing block does, a warp per token beside them the post mixes and the Sinkhorn.
// Why: at one token each launch is a dependent round of a few µs for ~64 KB of data; the fused form
// saved 1–2 µs a call on the H100, and the Sinkhorn now sets its end
// (docs/perf/2026-12-05-one-launch.md). The weights are loaded into registers before the programmatic
// wait (they do not depend on the kernels before) and split into their parts after it, beside the
// state's loads (split before it, sm_120's ptxas spilled in the norm-less form).
constexpr int kFusedRows = 2;
constexpr int kFusedThreads = kThreads + 32 * kFusedRows;
static_assert(kWarps == kSlicePairs, "a warp per pair of k-steps");

// Sum over the kThreads threads of warps 0 … kWarps − 1 (the fused form's x_in warps), in block_sum's
// order, with a named barrier that the Sinkhorn warps do not take part in.
__device__ __forceinline__ void x_warps_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory"); }
__device__ __forceinline__ float x_warps_sum(float v) {
  __shared__ float warp_sums[kWarps];
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  x_warps_sync();
  float total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += warp_sums[w];
  return total;
}

// Slice s's partial sums of the rows [row0, row0 + rows), rows ≤ kRows ≤ 16 (A rows g and g + 8), by
// warps 0 … kWarps − 1, warp p the k-steps of pair p with its weights w (pair_weights: as loaded, W =
// float4, split here after the state's loads are issued, or W = WeightParts, split by the caller):
// each warp's results go to shared memory, and after the barrier of those warps the first rows · NV
// threads add them up in the partial's order and write them.
__device__ __forceinline__ WeightParts parts_of(const float4& f) { return weight_parts(f); }
__device__ __forceinline__ const WeightParts& parts_of(const WeightParts& w) { return w; }
template <int NMix, bool kPost, int kRows, typename W>
__device__ __forceinline__ void pair_partials(const uint16_t* X, int64_t row0, int rows, int width,
                                              const PostSource& post, const W (&w)[2][(NMix + 7) / 8], int s,
                                              int slices, float* partials) {
  constexpr int NV = NMix + 1, NT = (NMix + 7) / 8;
  static_assert(kRows <= 16, "one tile of A rows");
  __shared__ float steps[kRows][kSliceSteps][NMix];  // r[ks][mix] of each row
  __shared__ float squares[kRows][kSlicePairs][4];    // ss_pq of each row
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const int first = piece_chunk(s, warp, q), chunks = width / 4;
  uint2 x[2][2] = {};  // [A row g, g + 8][half]
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (g + 8 * r < rows && first + h < chunks) x[r][h] = state_chunk<kPost>(X, width, post, row0 + g + 8 * r, first + h);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t a[4] = {x[0][h].x, x[1][h].x, x[0][h].y, x[1][h].y};
    WeightParts wh[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) wh[j] = parts_of(w[h][j]);
    float r[NT][4];
    mix_step(r, a, wh);
#pragma unroll
    for (int rr = 0; rr < 2; ++rr)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (g + 8 * rr < rows && 8 * j + 2 * q + e < NMix)
            steps[g + 8 * rr][2 * warp + h][8 * j + 2 * q + e] = r[j][2 * rr + e];
  }
#pragma unroll
  for (int rr = 0; rr < 2; ++rr)
    if (g + 8 * rr < rows) squares[g + 8 * rr][warp][q] = piece_squares(x[rr][0], x[rr][1]);
  x_warps_sync();
  for (int i = threadIdx.x; i < rows * NV; i += kThreads) {
    const int t = i / NV, j = i % NV;
    float v;
    if (j < NMix) {
      v = steps[t][0][j];
#pragma unroll
      for (int ks = 1; ks < kSliceSteps; ++ks) v = __fadd_rn(v, steps[t][ks][j]);
    } else {
      float a[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        float sp[kSlicePairs];
#pragma unroll
        for (int p = 0; p < kSlicePairs; ++p) sp[p] = squares[t][p][k];
        a[k] = pair_tree(sp);
      }
      v = (a[0] + a[1]) + (a[2] + a[3]);
    }
    partials[((row0 + t) * slices + s) * NV + j] = v;
  }
}

// Warp p's weights for pair_partials (split with weight_parts).
template <int NMix>
__device__ __forceinline__ void pair_weights(const float* fn, int width, int s, float4 (&f)[2][(NMix + 7) / 8]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int first = piece_chunk(s, warp, lane % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int j = 0; j < (NMix + 7) / 8; ++j) f[h][j] = mix_weights<NMix>(fn, width, 8 * j + lane / 4, first + h);
}

// A decode batch's rows (up to kPairRows, and up to 2 without a ticket): block (s, y) takes the 16-row
// tile y of slice s with pair_partials, its 8 warps sharing each row's k-steps (the prefill form gives a
// tile to one warp, a chain 8 times longer: at a few rows a slice's one warp would set the kernel's time).
constexpr int64_t kPairRows = 64;
static_assert(kHcPostPreMaxRows <= kPairRows, "the state computed beside the mixes: decode rows only");
template <int NMix, bool kPost>
__global__ void __launch_bounds__(kThreads)
    hc_mix_pair_partials_kernel(const uint16_t* __restrict__ X, int64_t T, int width, const float* __restrict__ fn,
                                int slices, float* __restrict__ partials, const PostSource post) {
  // The weights split before the programmatic wait: ~500 instructions a thread that are then off the
  // chain (split after it, the kernel took 2–5 µs more than the FMA form it replaced at 16–64 rows).
  constexpr int NT = (NMix + 7) / 8;
  float4 f[2][NT];
  pair_weights<NMix>(fn, width, blockIdx.x, f);
  WeightParts w[2][NT];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      w[h][j] = weight_parts(f[h][j]);
#pragma unroll
      for (int k = 0; k < 3; ++k)  // (computed here: the compiler would otherwise sink them past the wait)
        asm volatile("" : "+r"(w[h][j].b[k][0]), "+r"(w[h][j].b[k][1]));
    }
  pdl_wait();
  pdl_launch_dependents();
  const int64_t row0 = int64_t(blockIdx.y) * 16;
  pair_partials<NMix, kPost, 16>(X, row0, int(T - row0 < 16 ? T - row0 : 16), width, post, w, blockIdx.x, slices,
                                 partials);
}

template <int NMix, bool kPost, bool kNorm, int kRowChunks = kNormChunks>
__global__ void __launch_bounds__(kFusedThreads)
    hc_mix_fused_kernel(const uint16_t* __restrict__ X, int T, int D, const float* __restrict__ fn, int slices,
                        float* __restrict__ partials, const PostSource post_source, const float* __restrict__ base,
                        const float* __restrict__ scale, int iters, float norm_eps, float hc_eps,
                        const uint16_t* __restrict__ norm, uint16_t* __restrict__ out, float* __restrict__ post,
                        float* __restrict__ comb, unsigned* ticket, const Fp8Rows quant) {
  constexpr int HC = 4, NV = NMix + 1, NT = (NMix + 7) / 8;
  const int s = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int width = HC * D;
  float4 f[2][NT];  // (split after the wait, beside the state's loads: fewer registers held across it)
  if (warp < kWarps) pair_weights<NMix>(fn, width, s, f);
  NormedRows<HC, kRowChunks> rows;
  if constexpr (kNorm)
    if (warp < kWarps) rows.load_weight(norm, D);
  pdl_wait();
  pdl_launch_dependents();
  if (warp < kWarps) pair_partials<NMix, kPost, kFusedRows>(X, 0, T, width, post_source, f, s, slices, partials);
  // The last block to get here finishes (its ticket is the grid's size − 1) and resets the ticket for
  // the next launch: every thread's writes are made visible before thread 0 takes one.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  if (threadIdx.x == 0) *ticket = 0;
  __threadfence();

  __shared__ float sums[HC + 1];
  __shared__ float mix[kFusedRows][NMix];
  __shared__ float pre[HC];
  __shared__ float sink_pre[kFusedRows][HC];  // (the Sinkhorn warps' pre: x_in takes the x_in warps')
  if (warp >= kWarps) {  // the post mixes and the Sinkhorn of token warp − kWarps (hc_pre only)
    const int t = warp - kWarps;
    if (NMix == HC || t >= T) return;
    token_post_comb<HC, NMix, true>(partials + int64_t(t) * slices * NV, slices, width, norm_eps, base, scale, iters,
                                    hc_eps, lane, mix[t], sink_pre[t], post + t * HC, comb + t * HC * HC);
    return;
  }
  for (int t = 0; t < T; ++t) {  // x_in, token by token, as the finishing block
    if constexpr (kNorm) rows.template load_streams<true>(X + int64_t(t) * width, D);
    if (warp <= HC) {
      const float sum =
          slice_sum<NV, true>(partials + int64_t(t) * slices * NV, slices, warp < HC ? warp : NMix, lane);
      if (lane == 0) sums[warp] = sum;
    }
    x_warps_sync();
    __shared__ float mix0[HC];
    if (threadIdx.x < HC) mix0[threadIdx.x] = __fmul_rn(sums[threadIdx.x], rms_inverse(sums[HC], width, norm_eps));
    __syncwarp();
    if (warp == 0) token_pre_post<HC>(mix0, base, scale, hc_eps, lane, pre, nullptr);
    x_warps_sync();
    if constexpr (kNorm) {
      x_in_normed<HC>(rows, pre, D, norm_eps, out + int64_t(t) * D, quant_row(quant, t, D),
                      [](float v) { return x_warps_sum(v); });
    } else {
      // (x_in_plain's loads: X is this grid's output only with kPost, which always comes with a norm here)
      x_in_plain<HC>(X + int64_t(t) * width, pre, D, 0, 1, out + int64_t(t) * D);
    }
    x_warps_sync();  // the shared sums, pre and x_in are re-used by the next token
  }
}

// A thread per (token, kVec channels from d), blocks_per_token blocks of kThreads · kVec channels per
// token. kVec = 8 from kHcPostWideRows rows where D and the pointers allow 16-byte accesses: a prefill
// chunk's hc_post then stops issuing a 2-byte load per element (ncu at 8,192 tokens on an H200: 160 µs
// instead of 252; docs/perf/2026-12-06-prefill-hc.md). Fewer rows keep a channel a thread, so a decode
// token still spreads over 16 blocks (the wide form at 1 row ended ~1 µs later in the replayed step).
// The thread reads X[t, ·, d …] and writes out[t, ·, d …], nothing else, so out may alias X (hence no
// __restrict__ on them). Every element takes the same operations in either width.
template <int HC, int kVec>
__global__ void __launch_bounds__(kThreads) hc_post_kernel(const uint16_t* __restrict__ y, const uint16_t* X,
                                                           const float* __restrict__ post,
                                                           const float* __restrict__ comb, int D,
                                                           int blocks_per_token, uint16_t* out) {
  __shared__ float p[HC], C[HC * HC];
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x / blocks_per_token;
  const int d = ((blockIdx.x % blocks_per_token) * kThreads + threadIdx.x) * kVec;
  if (threadIdx.x < HC) p[threadIdx.x] = post[t * HC + threadIdx.x];
  if (threadIdx.x < HC * HC) C[threadIdx.x] = comb[t * HC * HC + threadIdx.x];
  __syncthreads();
  if (d >= D) return;
  const uint16_t* xt = X + t * HC * D;
  uint16_t* ot = out + t * HC * D;
  float x[HC][kVec], yd[kVec];
  const auto unpack = [](const uint16_t* src, float (&v)[kVec]) {
    if constexpr (kVec == 8) {
      const uint4 raw = *reinterpret_cast<const uint4*>(src);
      const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) v[2 * k] = __uint_as_float(w[k] << 16), v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) v[e] = bf16_value(src[e]);
    }
  };
#pragma unroll
  for (int a = 0; a < HC; ++a) unpack(xt + a * D + d, x[a]);
  unpack(y + t * D + d, yd);
#pragma unroll
  for (int b = 0; b < HC; ++b) {
    uint16_t h[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      float mixed = 0;
#pragma unroll
      for (int a = 0; a < HC; ++a) mixed = __fadd_rn(mixed, __fmul_rn(C[a * HC + b], x[a][e]));
      h[e] = bf16_bits(__fadd_rn(__fmul_rn(p[b], yd[e]), mixed));
    }
    if constexpr (kVec == 8) {
      uint32_t w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) w[k] = uint32_t(h[2 * k]) | uint32_t(h[2 * k + 1]) << 16;
      *reinterpret_cast<uint4*>(ot + b * D + d) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) ot[b * D + d + e] = h[e];
    }
  }
}

// Token groups (kMixWarps × 16 tokens) a partials block walks, one after another: a prefill chunk's
// blocks then live long enough (256 tokens) for their slice's weight parts in shared memory to pay
// their way; a decode step's few tokens keep a group a block.
int hc_groups_per_block(int64_t T) { return T >= 2048 ? 4 : 1; }
int64_t hc_tokens_per_block(int64_t T) { return int64_t(kMixWarps) * 16 * hc_groups_per_block(T); }

int hc_slices(int hc, int D) { return (hc * D / 4 + kSliceChunks - 1) / kSliceChunks; }
// Finishing blocks per token: a decode step's few tokens spread x_in over several SMs; a prefill
// chunk's many tokens fill the GPU with one each (every block re-adds the token's partial sums).
// Either way each channel's arithmetic is the same.
int hc_blocks_per_token(int64_t T, int D, bool norm) {
  return T >= 64 || norm ? 1 : (D + kFinishChannels - 1) / kFinishChannels;
}

void check_shape(const char* op, int64_t T, int hc, int D) {
  if (hc < 1 || hc > 4 || D <= 0 || T > 0x7fffffff || int64_t(hc) * D > 0x7fffffff)
    fail("{}: T {} hc {} D {} (hc must be 1…4)", op, T, hc, D);
}

// The mix kernels read X in 4-channel (8-byte) and fn in 4-weight (16-byte) vectors. They are built
// for hc = 4 only (DeepSeek-V4): other stream counts are supported by hc_post alone, because with
// sm_120's ptxas some of the other instantiations spill a register around the Sinkhorn's IEEE
// division calls (a build error under -warn-spills).
void check_mix_operands(const char* op, int64_t T, int hc, int D, const uint16_t* X, const float* fn,
                        const float* partials) {
  if (hc != 4) fail("{}: hc {} (the mix kernels are built for hc = 4)", op, hc);
  if (D % 4 || reinterpret_cast<uintptr_t>(X) % 8 || reinterpret_cast<uintptr_t>(fn) % 16)
    fail("{}: D {} must be a multiple of 4, X 8-byte and fn 16-byte aligned", op, D);
  if ((T + hc_tokens_per_block(T) - 1) / hc_tokens_per_block(T) > 65535 ||
      T * hc_blocks_per_token(T, D, false) + T > 0x7fffffff)
    fail("{}: {} tokens exceed the grid", op, T);
  if (T && !partials) fail("{}: no scratch for the partial sums", op);
}

// With source.y (hc_post_pre) the partials kernel computes X (= source.out) from the previous state.
// With a ticket, up to kFusedRows tokens run in the fused form (one launch).
template <int HC, int NMix>
void launch_hc_mix(const uint16_t* X, int64_t T, int D, const float* fn, const float* base, const float* scale,
                   int iters, float norm_eps, float hc_eps, float* partials, const uint16_t* norm, uint16_t* out,
                   float* post, float* comb, cudaStream_t stream, unsigned* ticket, const Fp8Rows& quant,
                   const PostSource& source = {}) {
  if (norm && !hc_norm_fits(D, X, out, norm)) fail("hc mixes: a norm over D {} does not fit the finishing block", D);
  if (quant.q && !(norm && hc_norm_quant_fits(D, quant)))
    fail("hc mixes: FP8 codes of x_in need the norm and a width of a multiple of 256 (D {})", D);
  const int slices = hc_slices(HC, D), blocks_per_token = hc_blocks_per_token(T, D, norm);
  // (kPost without a norm reads the state it writes through x_in_plain's plain loads: two launches.)
  if (ticket && T <= kFusedRows && (norm || !source.y)) {
    // A decode row's norm over D ≤ 4096 (Flash) takes kDecodeNormChunks a thread: the finishing path, which runs
    // cold in one block on the chain, is then half the unrolled code (docs/perf/2026-12-06-stream-priority.md).
    constexpr int kN = kDecodeNormChunks;
    const bool narrow = D <= kN * 8 * kThreads;
    auto kernel = source.y ? (norm ? (narrow ? hc_mix_fused_kernel<NMix, true, true, kN> : hc_mix_fused_kernel<NMix, true, true>)
                                   : hc_mix_fused_kernel<NMix, true, false>)
                           : (norm ? (narrow ? hc_mix_fused_kernel<NMix, false, true, kN> : hc_mix_fused_kernel<NMix, false, true>)
                                   : hc_mix_fused_kernel<NMix, false, false>);
    launch_programmatic(kernel, dim3(unsigned(slices)), dim3(kFusedThreads), 0, stream, X, int(T), D, fn, slices,
                        partials, source, base, scale, iters, norm_eps, hc_eps, norm, out, post, comb, ticket, quant);
    return;
  }
  if (T <= kPairRows) {
    launch_programmatic(source.y ? hc_mix_pair_partials_kernel<NMix, true> : hc_mix_pair_partials_kernel<NMix, false>,
                        dim3(unsigned(slices), unsigned((T + 15) / 16)), dim3(kThreads), 0, stream, X, T, HC * D, fn,
                        slices, partials, source);
  } else {
    if (source.y) fail("hc mixes: the state computed beside them for {} rows (at most {})", T, kPairRows);
    const int64_t per_block = hc_tokens_per_block(T);
    launch_programmatic(hc_mix_partials_kernel<NMix>, dim3(unsigned(slices), unsigned((T + per_block - 1) / per_block)),
                        dim3(kMixThreads), 0, stream, X, T, HC * D, fn, slices, hc_groups_per_block(T), partials);
  }
  const int64_t blocks = T * blocks_per_token + (NMix > HC ? (T + kWarps - 1) / kWarps : 0);
  // As the decode form: at Flash's D the norm's chunks a thread are 2, and the registers half (64, so a
  // prefill chunk's finishing blocks run four to an SM: 142 µs instead of 196 at 8,192 tokens, H200).
  const bool narrow = D <= kDecodeNormChunks * 8 * kThreads;
  auto finish = norm ? (narrow ? hc_mix_finish_kernel<HC, NMix, true, kDecodeNormChunks> : hc_mix_finish_kernel<HC, NMix, true>)
                     : hc_mix_finish_kernel<HC, NMix, false>;
  launch_programmatic(finish, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, X, T, D,
                      static_cast<const float*>(partials), slices, base, scale, iters, norm_eps, hc_eps,
                      blocks_per_token, norm, out, post, comb, quant);
}

constexpr int64_t kHcPostWideRows = 64;

template <int HC>
void launch_hc_post(const uint16_t* y, const uint16_t* X, const float* post, const float* comb, int64_t T, int D,
                    uint16_t* out, cudaStream_t stream) {
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = T >= kHcPostWideRows && D % 8 == 0 && aligned16(y) && aligned16(X) && aligned16(out);
  const int per_block = kThreads * (vec ? 8 : 1), blocks_per_token = (D + per_block - 1) / per_block;
  if (T * blocks_per_token > 0x7fffffff) fail("hc_post: {} tokens of {} exceed the grid", T, D);
  launch_programmatic(vec ? hc_post_kernel<HC, 8> : hc_post_kernel<HC, 1>, dim3(unsigned(T * blocks_per_token)),
                      dim3(kThreads), 0, stream, y, X, post, comb, D, blocks_per_token, out);
}

}  // namespace

bool hc_norm_fits(int D, const uint16_t* X, const uint16_t* out, const uint16_t* norm) {
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return D > 0 && D % 8 == 0 && D <= kMaxNormWidth && aligned16(X) && aligned16(out) && aligned16(norm);
}

bool hc_norm_quant_fits(int D, const Fp8Rows& quant) {
  const auto aligned = [](const void* p, unsigned bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  return act_quant_rows_fit(D) && aligned(quant.q, 8) && aligned(quant.values, 16);
}

int64_t hc_mix_scratch_floats(int64_t T, int hc, int D, bool head) {
  const int n_mix = head ? hc : (2 + hc) * hc;
  return T * hc_slices(hc, D) * (n_mix + 1);
}

void hc_pre(const uint16_t* X, int64_t T, int hc, int D, const float* fn, const float* base, const float* scale,
            int iters, float norm_eps, float hc_eps, float* partials, const uint16_t* norm, uint16_t* out,
            float* post, float* comb, cudaStream_t stream, unsigned* ticket, const Fp8Rows& quant) {
  check_shape("hc_pre", T, hc, D);
  check_mix_operands("hc_pre", T, hc, D, X, fn, partials);
  if (T == 0) return;
  launch_hc_mix<4, 24>(X, T, D, fn, base, scale, iters, norm_eps, hc_eps, partials, norm, out, post, comb, stream, ticket,
                       quant);
}

void hc_post_pre(const uint16_t* y, const uint16_t* X_prev, const float* post_prev, const float* comb_prev, int64_t T,
                 int hc, int D, uint16_t* X, const float* fn, const float* base, const float* scale, int iters,
                 float norm_eps, float hc_eps, float* partials, const uint16_t* norm, uint16_t* out, float* post,
                 float* comb, cudaStream_t stream, unsigned* ticket, const Fp8Rows& quant) {
  check_shape("hc_post_pre", T, hc, D);
  check_mix_operands("hc_post_pre", T, hc, D, X, fn, partials);
  if (T > kHcPostPreMaxRows) fail("hc_post_pre: {} rows (at most {}; run hc_post, then hc_pre)", T, kHcPostPreMaxRows);
  if (reinterpret_cast<uintptr_t>(X_prev) % 8 || reinterpret_cast<uintptr_t>(y) % 8 || X == X_prev)
    fail("hc_post_pre: y and the previous state 8-byte aligned, the new state apart from the previous one");
  if (T == 0) return;
  launch_hc_mix<4, 24>(X, T, D, fn, base, scale, iters, norm_eps, hc_eps, partials, norm, out, post, comb, stream, ticket,
                       quant, PostSource{y, X_prev, post_prev, comb_prev, X, D});
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
             float norm_eps, float hc_eps, float* partials, const uint16_t* norm, uint16_t* out,
             cudaStream_t stream, unsigned* ticket) {
  check_shape("hc_head", T, hc, D);
  check_mix_operands("hc_head", T, hc, D, X, fn, partials);
  if (T == 0) return;
  launch_hc_mix<4, 4>(X, T, D, fn, base, scale, 0, norm_eps, hc_eps, partials, norm, out, nullptr, nullptr,
                      stream, ticket, Fp8Rows{});
}

}  // namespace dsv4::cuda
