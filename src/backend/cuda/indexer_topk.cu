// Lightning-indexer scores (mma.sync bf16, FP4 keys dequantised in registers) and radix top-k.
//
// Scores: the MMA's M side is the keys ("swap AB": a query has 64 heads but thousands of keys), its
// N side the 64 heads, K the 128 dims. The k order inside one m16n8k16 is free as long as A and B
// agree, so thread `tig` feeds the dims of FP4 block `tig` (32tig … 32tig+31): one 16-byte load and
// one scale per key row, and the per-block scale multiplies that thread's A values only. The 64 Q
// columns stay in registers (B fragments) for every key tile of the warp.
// Top-k: one CTA per query; two 8-bit histogram passes find the k-th largest bf16 score (the first
// accumulated by the scores kernel), and one more pass writes the keys above it plus the
// lowest-index ties in ascending index order.
#include "backend/cuda/indexer_topk.h"

#include <algorithm>
#include <type_traits>

#include "backend/cuda/ptx_primitives.cuh"
#include "backend/kv_cache_layout.h"

namespace dsv4::cuda {
namespace {

namespace kl = dsv4::kv_layout;
constexpr int kDim = kl::kIndexDim;  // 128
constexpr int kTileKeys = 16;
constexpr int kScoreWarps = 4;
constexpr int kScoreThreads = 32 * kScoreWarps;
constexpr int kQRowBytes = kDim * 2 + 16;
constexpr int kTopkThreads = 1024;

struct ScoreParams {
  IndexerArgs a;
  uint16_t* scores;
  int score_stride;
  int32_t* histogram;  // [queries, 256] counts of the scores' high order-key byte (zeroed before)
  int tiles_per_cta;
};

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// Four e2m1 codes (16 bits, first value in the low nibble) times a power-of-two scale (bf16x2)
// → two bf16x2. Magnitudes come from byte lookup tables (prmt), the signs are or-ed in, and the
// scale multiply is exact.
__device__ __forceinline__ void e2m1x4_to_bf16x4(uint32_t x, __nv_bfloat162 scale, uint32_t& lo_pair,
                                                 uint32_t& hi_pair) {
  // bf16 of {0, .5, 1, 1.5, 2, 3, 4, 6}: 0000 3f00 3f80 3fc0 4000 4040 4080 40c0.
  constexpr uint32_t kLow0 = 0xc0800000u, kLow1 = 0xc0804000u;
  constexpr uint32_t kHigh0 = 0x3f3f3f00u, kHigh1 = 0x40404040u;
  const uint32_t idx = x & 0x7777u;
  const uint32_t lo = prmt(kLow0, kLow1, idx), hi = prmt(kHigh0, kHigh1, idx);
  uint32_t p0 = prmt(lo, hi, 0x5140u) | ((x & 0x8u) << 12) | ((x & 0x80u) << 24);
  uint32_t p1 = prmt(lo, hi, 0x7362u) | ((x & 0x800u) << 4) | ((x & 0x8000u) << 16);
  __nv_bfloat162 b0 = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&p0), scale);
  __nv_bfloat162 b1 = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&p1), scale);
  lo_pair = *reinterpret_cast<uint32_t*>(&b0);
  hi_pair = *reinterpret_cast<uint32_t*>(&b1);
}

__device__ __forceinline__ __nv_bfloat162 e8m0_to_bf16x2(uint32_t e) {
  const uint16_t bits = e == 0 ? uint16_t(0x0040) : uint16_t(e << 7);  // 2^(e-127) as bf16
  const uint32_t two = uint32_t(bits) | (uint32_t(bits) << 16);
  return *reinterpret_cast<const __nv_bfloat162*>(&two);
}


__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// Grid (key chunks, queries); each warp walks tiles of 16 keys of its CTA's chunk.
__global__ void __launch_bounds__(kScoreThreads) indexer_score_kernel(const ScoreParams p) {
  pdl_wait();  // q, weights and keys come from earlier kernels
  pdl_launch_dependents();  // the top-k CTA may be scheduled now; it waits for this grid
  const IndexerArgs& a = p.a;
  const int query = blockIdx.y;
  const int n = a.key_counts[query];
  const int tile_begin = blockIdx.x * p.tiles_per_cta;
  const int tile_end = min(tile_begin + p.tiles_per_cta, (n + kTileKeys - 1) / kTileKeys);
  if (tile_begin >= tile_end) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  // The first key tile's loads go out first: their two dependent latencies (page id, then data)
  // overlap the staging of q below.
  const int32_t* table = a.block_table + size_t(a.query_seq[query]) * a.pages_stride;
  uint16_t* out = p.scores + size_t(query) * p.score_stride;
  // Key rows gid and gid+8 of a tile: block `tig` (16 B) and its scale; zeros past the key count.
  auto load_tile = [&](int tile, uint4 (&data)[2], uint32_t (&scale)[2]) {
    const int key0 = tile * kTileKeys;
    const int64_t page_base = tile < tile_end ? int64_t(table[key0 / kl::kEntriesPerPage]) * kl::kEntriesPerPage : 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = key0 + gid + 8 * h;
      data[h] = make_uint4(0, 0, 0, 0);
      scale[h] = 127;
      if (tile < tile_end && j < n) {
        const int64_t g = page_base + j % kl::kEntriesPerPage;
        data[h] = *reinterpret_cast<const uint4*>(a.key_pool + kl::index_fp4_data_offset(g) + tig * 16);
        scale[h] = a.key_pool[kl::index_fp4_scale_offset(g) + tig];
      }
    }
  };
  uint4 data[2];
  uint32_t scale_bits[2];
  load_tile(tile_begin + warp, data, scale_bits);

  __shared__ __align__(16) uint8_t q_smem[kIndexerHeads * kQRowBytes];
  const uint4* q_src = reinterpret_cast<const uint4*>(a.q + size_t(query) * kIndexerHeads * kDim);
#pragma unroll
  for (int i = threadIdx.x; i < kIndexerHeads * kDim / 8; i += kScoreThreads)
    *reinterpret_cast<uint4*>(q_smem + (i / 16) * kQRowBytes + (i % 16) * 16) = q_src[i];
  __syncthreads();
  // B fragments for all 64 heads (n tiles) and 8 k steps: head nt·8+gid, dims 32tig+4s … +3.
  uint32_t qb[8][8][2];
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      const uint2 v = *reinterpret_cast<const uint2*>(q_smem + (nt * 8 + gid) * kQRowBytes + (32 * tig + 4 * s) * 2);
      qb[nt][s][0] = v.x;
      qb[nt][s][1] = v.y;
    }
  float w[8][2];
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      w[nt][e] = __bfloat162float(a.weights[size_t(query) * kIndexerHeads + nt * 8 + 2 * tig + e]);

  __shared__ int hist[256];
  for (int i = threadIdx.x; i < 256; i += kScoreThreads) hist[i] = 0;

  __syncthreads();  // hist zeroed
  for (int tile = tile_begin + warp; tile < tile_end; tile += kScoreWarps) {
    const int key0 = tile * kTileKeys;
    const uint4 cur[2] = {data[0], data[1]};
    const __nv_bfloat162 scale[2] = {e8m0_to_bf16x2(scale_bits[0]), e8m0_to_bf16x2(scale_bits[1])};
    load_tile(tile + kScoreWarps, data, scale_bits);  // prefetch: its latency overlaps this tile's MMAs
    float acc[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      uint32_t af[4];
      const uint32_t w0 = s < 2 ? cur[0].x : s < 4 ? cur[0].y : s < 6 ? cur[0].z : cur[0].w;
      const uint32_t w1 = s < 2 ? cur[1].x : s < 4 ? cur[1].y : s < 6 ? cur[1].z : cur[1].w;
      e2m1x4_to_bf16x4((w0 >> (16 * (s & 1))) & 0xffffu, scale[0], af[0], af[2]);
      e2m1x4_to_bf16x4((w1 >> (16 * (s & 1))) & 0xffffu, scale[1], af[1], af[3]);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) mma_bf16(acc[nt], af, qb[nt][s][0], qb[nt][s][1]);
    }
    // d = bf16(dot), ReLU, bf16(d · w_h), f32 head sum (starting from +0, so never −0), bf16.
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        sum[0] += round_bf16(fmaxf(round_bf16(acc[nt][e]), 0.f) * w[nt][e]);
        sum[1] += round_bf16(fmaxf(round_bf16(acc[nt][2 + e]), 0.f) * w[nt][e]);
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
      sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
      const int j = key0 + gid + 8 * h;
      if (tig == 0 && j < n) {
        const uint32_t key = indexer_order_key(__bfloat16_as_ushort(__float2bfloat16_rn(sum[h])));
        out[j] = uint16_t(key);
        atomicAdd(&hist[key >> 8], 1);
      }
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += kScoreThreads)
    if (hist[i]) atomicAdd(&p.histogram[size_t(query) * 256 + i], hist[i]);
}

constexpr int kTopkWarps = kTopkThreads / 32;
constexpr int kTopkBatch = 4;  // steps of 256 scores per warp whose loads are in flight together

// Highest bin b of hist[0..256) with above + Σ_{>b} < k ≤ above + Σ_{≥b}, found by warp 0
// (8 bins per lane, suffix sums by shuffles). Returns b, *count_above = above + Σ_{>b}.
__device__ int find_bin_warp(const int* hist, int k, int above, int* count_above) {
  const int lane = threadIdx.x % 32;
  int local[8], mine = 0;  // lane l holds bins 255-8l … 248-8l (descending)
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    local[i] = hist[255 - 8 * lane - i];
    mine += local[i];
  }
  int incl = mine;  // inclusive prefix over lanes (higher bins first)
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  int cum = above + incl - mine;
  int found = -1, found_above = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if (found < 0 && cum + local[i] >= k) { found = 255 - 8 * lane - i; found_above = cum; }
    cum += local[i];
  }
  const unsigned hit = __ballot_sync(0xffffffffu, found >= 0);
  const int src = hit ? __ffs(hit) - 1 : 31;
  *count_above = __shfl_sync(0xffffffffu, found_above, src);
  return __shfl_sync(0xffffffffu, hit ? found : 0, src);
}

// One lane's 8 order keys at index i (one 16-byte load); unless kFull, those at or past `end` are
// flagged invalid.
template <bool kFull>
__device__ __forceinline__ void unpack_keys(const uint4& v, int i, int end, uint32_t (&key)[8], bool (&valid)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    key[e] = (e % 2) ? w[e / 2] >> 16 : w[e / 2] & 0xffffu;
    valid[e] = kFull || i + e < end;
  }
}

// One CTA per query. Warp w owns the contiguous score range [w·per, (w+1)·per) (per a multiple of
// 8: one 16-byte load = 8 scores per lane), lane l of a step the 8 scores from step + 8l, so index
// order = (warp, step, lane, element). Two radix passes find the threshold (the k-th largest key) and
// each warp's count of keys above it and equal to it; from their prefix sums over the warps every
// warp knows where its selections go, and writes them in index order without a sort. The kernel is
// bound by its instructions per key (one SM does all of a query), hence integer keys, steps without
// bounds checks and one scan per step.
__global__ void __launch_bounds__(kTopkThreads, 1) indexer_topk_kernel(const uint16_t* __restrict__ scores, int stride,
                                                                    int32_t* __restrict__ histogram,
                                                                    const int32_t* __restrict__ key_counts, int k,
                                                                    int32_t* __restrict__ topk) {
  __shared__ int low_hist[kTopkWarps][256];  // per warp: low byte of the keys whose high byte is the threshold's
  __shared__ int sum_hist[256];
  __shared__ int warp_greater[kTopkWarps], warp_ties[kTopkWarps];
  __shared__ int shared_vals[4];
  pdl_wait();  // the scores and their high-byte histogram
  const int query = blockIdx.x, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int n = key_counts[query];
  const uint16_t* sc = scores + size_t(query) * stride;
  int32_t* out = topk + size_t(query) * k;
  int32_t* hist = histogram + size_t(query) * 256;
  if (n <= k) {  // everything is taken
    if (tid < 256) hist[tid] = 0;  // not needed, still consumed
    for (int i = tid; i < k; i += kTopkThreads) out[i] = i < n ? i : -1;
    return;
  }
  const int per = (n + 8 * kTopkWarps - 1) / (8 * kTopkWarps) * 8;
  const int w_begin = min(n, warp * per), w_end = min(n, w_begin + per);
  // A batch = kTopkBatch steps of 256 scores whose 16-byte loads are issued together; the first
  // batch stays in registers for the collect pass.
  auto load_batch = [&](int s0, uint4 (&v)[kTopkBatch]) {
#pragma unroll
    for (int b = 0; b < kTopkBatch; ++b) {
      const int i = s0 + 256 * b + 8 * lane;
      v[b] = i < w_end ? *reinterpret_cast<const uint4*>(sc + i) : make_uint4(0, 0, 0, 0);
    }
  };
  uint4 first[kTopkBatch];
  load_batch(w_begin, first);

  for (int i = tid; i < kTopkWarps * 256; i += kTopkThreads) (&low_hist[0][0])[i] = 0;
  if (warp == 0) {
    int above = 0;
    const int high = find_bin_warp(hist, k, 0, &above);
    if (lane == 0) { shared_vals[0] = high; shared_vals[1] = above; }
  }
  __syncthreads();
  if (tid < 256) hist[tid] = 0;  // consumed: ready for the next scores call
  const uint32_t high = shared_vals[0], high_end = (high + 1) << 8;
  int greater_high = 0;  // this lane's keys whose high byte is above the threshold's
  auto count_step = [&](auto full, int i, const uint4& v) {
    uint32_t key[8];
    bool valid[8];
    unpack_keys<decltype(full)::value>(v, i, w_end, key, valid);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (valid[e] && (key[e] >> 8) == high) atomicAdd(&low_hist[warp][key[e] & 255], 1);
      greater_high += valid[e] && key[e] >= high_end;
    }
  };
  auto count_batch = [&](int s0, const uint4 (&v)[kTopkBatch]) {
#pragma unroll
    for (int b = 0; b < kTopkBatch; ++b) {
      const int step = s0 + 256 * b;
      if (step + 256 <= w_end) count_step(std::true_type{}, step + 8 * lane, v[b]);
      else if (step < w_end) count_step(std::false_type{}, step + 8 * lane, v[b]);
    }
  };
  count_batch(w_begin, first);
  for (int s0 = w_begin + 256 * kTopkBatch; s0 < w_end; s0 += 256 * kTopkBatch) {
    uint4 v[kTopkBatch];
    load_batch(s0, v);
    count_batch(s0, v);
  }
  greater_high = __reduce_add_sync(0xffffffffu, greater_high);
  __syncthreads();
  for (int b = tid; b < 256; b += kTopkThreads) {
    int total = 0;
    for (int w = 0; w < kTopkWarps; ++w) total += low_hist[w][b];
    sum_hist[b] = total;
  }
  __syncthreads();
  if (warp == 0) {
    int above = 0;
    const int low = find_bin_warp(sum_hist, k, shared_vals[1], &above);
    if (lane == 0) { shared_vals[2] = low; shared_vals[3] = above; }
  }
  __syncthreads();
  const uint32_t low = shared_vals[2], threshold = (high << 8) | low;
  const int take_equal = k - shared_vals[3];  // ties taken, lowest indices first (≥ 1)
  {
    int above = 0;
    for (int b = int(low) + 1 + lane; b < 256; b += 32) above += low_hist[warp][b];
    above = __reduce_add_sync(0xffffffffu, above) + greater_high;
    if (lane == 0) { warp_greater[warp] = above; warp_ties[warp] = low_hist[warp][low]; }
  }
  __syncthreads();
  // Prefix sums over the warps (lane v ↔ warp v) of their keys above the threshold and their ties.
  int pos, tie_rank;
  {
    const int g = warp_greater[lane], t = warp_ties[lane];
    int incl_g = g, incl_t = t;
    for (int o = 1; o < 32; o <<= 1) {
      const int yg = __shfl_up_sync(0xffffffffu, incl_g, o), yt = __shfl_up_sync(0xffffffffu, incl_t, o);
      if (lane >= o) { incl_g += yg; incl_t += yt; }
    }
    const int before_g = __shfl_sync(0xffffffffu, incl_g - g, warp);
    tie_rank = __shfl_sync(0xffffffffu, incl_t - t, warp);  // global rank of this warp's first tie
    pos = before_g + min(take_equal, tie_rank);              // where this warp's first selection goes
  }
  // Collect in index order. Steps are warp-uniform: the prefix sums use full-warp shuffles.
  auto collect_step = [&](auto full, int i, const uint4& v) {
    uint32_t key[8];
    bool valid[8];
    unpack_keys<decltype(full)::value>(v, i, w_end, key, valid);
    int greater = 0, ties = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      greater += valid[e] && key[e] > threshold;
      ties += valid[e] && key[e] == threshold;
    }
    // One scan of both counts: each is ≤ 8 per lane and ≤ 256 per step.
    const uint32_t packed = (uint32_t(greater) << 16) | uint32_t(ties);
    uint32_t incl = packed;
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    const uint32_t excl = incl - packed, total = __shfl_sync(0xffffffffu, incl, 31);
    const int ties_left = max(take_equal - tie_rank, 0);  // ties this warp may still take from here
    if (packed != 0) {
      int rank = int(excl & 0xffffu);  // this lane's first tie, from the step start
      int at = pos + int(excl >> 16) + min(ties_left, rank);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (valid[e] && key[e] > threshold) {
          out[at++] = i + e;
        } else if (valid[e] && key[e] == threshold) {
          if (rank < ties_left) out[at++] = i + e;
          ++rank;
        }
      }
    }
    pos += int(total >> 16) + min(ties_left, int(total & 0xffffu));
    tie_rank += int(total & 0xffffu);
  };
  auto collect_batch = [&](int s0, const uint4 (&v)[kTopkBatch]) {
#pragma unroll
    for (int b = 0; b < kTopkBatch; ++b) {
      const int step = s0 + 256 * b;
      if (step + 256 <= w_end) collect_step(std::true_type{}, step + 8 * lane, v[b]);
      else if (step < w_end) collect_step(std::false_type{}, step + 8 * lane, v[b]);
    }
  };
  collect_batch(w_begin, first);
  for (int s0 = w_begin + 256 * kTopkBatch; s0 < w_end; s0 += 256 * kTopkBatch) {
    uint4 v[kTopkBatch];
    load_batch(s0, v);
    collect_batch(s0, v);
  }
}

int tiles_per_cta_for(const IndexerArgs& a) {
  static const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  // Aim at about 2 CTAs per SM over the whole batch; a CTA handles tiles_per_cta tiles of 16 keys.
  const int64_t tiles = int64_t(a.num_queries) * ((a.max_keys + kTileKeys - 1) / kTileKeys);
  const int64_t per = (tiles + 2 * sms - 1) / (2 * sms);
  return int(std::clamp<int64_t>((per + kScoreWarps - 1) / kScoreWarps * kScoreWarps, kScoreWarps, 256));
}

}  // namespace

IndexerWorkspace::IndexerWorkspace(int max_queries, int max_keys)
    : max_queries_(max_queries),
      max_keys_(max_keys),
      score_stride_((max_keys + 7) / 8 * 8),
      scores_(size_t(max_queries) * score_stride_),
      histogram_(size_t(max_queries) * 256) {
  histogram_.fill_bytes(0);  // from then on every top-k call leaves its rows zero
  DSV4_CUDA_CHECK(cudaDeviceSynchronize());
}

int indexer_score_ctas(const IndexerArgs& a) {
  const int tiles = (a.max_keys + kTileKeys - 1) / kTileKeys;
  return (tiles + tiles_per_cta_for(a) - 1) / tiles_per_cta_for(a) * a.num_queries;
}

void indexer_scores(const IndexerWorkspace& ws, const IndexerArgs& a, cudaStream_t stream) {
  DSV4_CHECK(a.num_queries <= ws.max_queries() && a.max_keys <= ws.max_keys(),
             "indexer: {} queries × {} keys exceed the workspace", a.num_queries, a.max_keys);
  if (a.num_queries == 0 || a.max_keys == 0) return;
  ScoreParams p{a, ws.scores(), ws.score_stride(), ws.histogram(), tiles_per_cta_for(a)};
  const int tiles = (a.max_keys + kTileKeys - 1) / kTileKeys;
  dim3 grid((tiles + p.tiles_per_cta - 1) / p.tiles_per_cta, a.num_queries);
  launch_programmatic(indexer_score_kernel, grid, dim3(kScoreThreads), 0, stream, p);
}

void indexer_select_topk(const IndexerWorkspace& ws, const IndexerArgs& a, cudaStream_t stream) {
  DSV4_CHECK(a.k >= 1 && a.k <= kIndexerMaxTopk, "indexer: k = {} outside 1 … {}", a.k, kIndexerMaxTopk);
  if (a.num_queries == 0) return;
  launch_programmatic(indexer_topk_kernel, dim3(a.num_queries), dim3(kTopkThreads), 0, stream, ws.scores(),
                      ws.score_stride(), ws.histogram(), a.key_counts, a.k, a.topk);
}

void indexer_topk(const IndexerWorkspace& ws, const IndexerArgs& a, cudaStream_t stream) {
  indexer_scores(ws, a, stream);
  indexer_select_topk(ws, a, stream);
}

}  // namespace dsv4::cuda
