// Lightning-indexer scores (mma.sync bf16, FP4 keys dequantised in registers) and radix top-k.
//
// Scores: the MMA's M side is the keys ("swap AB": a query has 64 heads but thousands of keys), its
// N side the 64 heads, K the 128 dims. The k order inside one m16n8k16 is free as long as A and B
// agree, so thread `tig` feeds the dims of FP4 block `tig` (32tig … 32tig+31): one 16-byte load and
// one scale per key row, and the per-block scale multiplies that thread's A values only. The 64 Q
// columns stay in registers (B fragments) for every key tile of the warp.
// Top-k: two 8-bit radix passes find the k-th largest score (the first histogram accumulated by the
// scores kernel, the second by a count kernel over slices of each query's keys), and a collect
// kernel over the same slices writes the keys above it plus the lowest-index ties in ascending index
// order, each slice and warp at an offset known from the counts before it.
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
constexpr int kTopkThreads = 512;

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
  const int32_t* table = a.block_table + size_t(a.query_seq[query]) * a.pages_stride;
  uint16_t* out = p.scores + size_t(query) * p.score_stride;
  // A tile's 16 keys lie in one page. Its page id is loaded one tile ahead of its data, so that a data
  // load never waits for the id it depends on; the data are loaded one tile ahead of the MMAs.
  static_assert(kl::kEntriesPerPage % kTileKeys == 0, "a key tile within one page");
  auto page_of = [&](int tile) {
    return tile < tile_end ? int64_t(table[tile * kTileKeys / kl::kEntriesPerPage]) * kl::kEntriesPerPage : int64_t(0);
  };
  // Key rows gid and gid+8 of a tile: block `tig` (16 B) and its scale; zeros past the key count.
  auto load_tile = [&](int tile, int64_t page_base, uint4 (&data)[2], uint32_t (&scale)[2]) {
    const int key0 = tile * kTileKeys;
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
  // The first tile's loads go out before q is staged, the next tile's page id with them.
  uint4 data[2];
  uint32_t scale_bits[2];
  load_tile(tile_begin + warp, page_of(tile_begin + warp), data, scale_bits);
  int64_t next_page = page_of(tile_begin + warp + kScoreWarps);

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
  // Head weights of this lane's two heads per n tile (2·tig, 2·tig + 1), as bf16x2.
  __nv_bfloat162 w[8];
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
    w[nt] = *reinterpret_cast<const __nv_bfloat162*>(a.weights + size_t(query) * kIndexerHeads + nt * 8 + 2 * tig);

  __shared__ int hist[256];
  for (int i = threadIdx.x; i < 256; i += kScoreThreads) hist[i] = 0;

  __syncthreads();  // hist zeroed
  for (int tile = tile_begin + warp; tile < tile_end; tile += kScoreWarps) {
    const int key0 = tile * kTileKeys;
    const uint4 cur[2] = {data[0], data[1]};
    const __nv_bfloat162 scale[2] = {e8m0_to_bf16x2(scale_bits[0]), e8m0_to_bf16x2(scale_bits[1])};
    load_tile(tile + kScoreWarps, next_page, data, scale_bits);  // its latency overlaps this tile's MMAs
    next_page = page_of(tile + 2 * kScoreWarps);
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
    // d = bf16(dot), ReLU, bf16(d · w_h), f32 head sum (starting from +0, so never −0), bf16 — on
    // bf16x2 pairs (two heads): the bf16 product of two bf16 values rounds once, as bf16(f32 product)
    // does (the f32 product is exact).
    const __nv_bfloat162 zero = __float2bfloat162_rn(0.f);
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const __nv_bfloat162 d = __floats2bfloat162_rn(acc[nt][2 * h], acc[nt][2 * h + 1]);
        const __nv_bfloat162 prod = __hmul2(__hmax2(d, zero), w[nt]);
        sum[h] += __low2float(prod);
        sum[h] += __high2float(prod);
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
// A warp's part of a slice is ≤ kTopkSteps steps of 256 keys (8 per lane, one 16-byte load each),
// all loaded at once and kept in registers.
constexpr int kTopkSteps = kIndexerTopkSliceKeys / kTopkWarps / 256;
static_assert(kTopkSteps * 256 * kTopkWarps == kIndexerTopkSliceKeys && kTopkSteps >= 1, "whole steps per warp");

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

struct TopkParams {
  const uint16_t* scores;
  int stride;
  int32_t* histogram;      // [queries, 256] high-byte counts from the scores kernel
  int32_t* slice_hist;     // [queries, max_slices, 256]
  int32_t* slice_greater;  // [queries, max_slices]
  int32_t* high_bin;       // [queries]
  int max_slices;
  const int32_t* key_counts;
  int k;
  int32_t* topk;
};

// A CTA's view of its slice: warp w owns [begin, end), a multiple-of-8 share of the slice in index
// order, lane l of step j the 8 keys from begin + 256 j + 8 l. Index order = (slice, warp, step,
// lane, element).
struct SliceWarp {
  int begin, end;
  uint4 v[kTopkSteps];

  __device__ SliceWarp(const TopkParams& p, int query, int n, int slice, int warp, int lane) {
    const int s0 = slice * kIndexerTopkSliceKeys, len = min(n - s0, kIndexerTopkSliceKeys);
    const int per = (len + 8 * kTopkWarps - 1) / (8 * kTopkWarps) * 8;
    begin = s0 + min(len, warp * per);
    end = s0 + min(len, warp * per + per);
    const uint16_t* sc = p.scores + size_t(query) * p.stride;
#pragma unroll
    for (int j = 0; j < kTopkSteps; ++j) {
      const int i = begin + 256 * j + 8 * lane;
      v[j] = i < end ? *reinterpret_cast<const uint4*>(sc + i) : make_uint4(0, 0, 0, 0);
    }
  }
  // f(full, i, v) for each step (warp-uniform; `full`: no key of the step is past `end`).
  template <class F>
  __device__ void for_steps(int lane, F&& f) const {
#pragma unroll
    for (int j = 0; j < kTopkSteps; ++j) {
      const int step = begin + 256 * j;
      if (step + 256 <= end) f(std::true_type{}, step + 8 * lane, v[j]);
      else if (step < end) f(std::false_type{}, step + 8 * lane, v[j]);
    }
  }
};

// Top-k, first kernel: grid (slices, queries). The threshold's high byte comes from the scores
// kernel's histogram; each slice counts the low bytes of its keys in that bin and its keys above it.
// One query's work spreads over ⌈n / kIndexerTopkSliceKeys⌉ SMs: the passes cost instructions per
// key, so a single CTA per query would bound long contexts.
__global__ void __launch_bounds__(kTopkThreads) indexer_topk_count_kernel(const TopkParams p) {
  __shared__ int low_hist[kTopkWarps][256];
  __shared__ int warp_greater[kTopkWarps];
  __shared__ int shared_high;
  pdl_wait();  // the scores and their high-byte histogram
  pdl_launch_dependents();
  const int query = blockIdx.y, slice = blockIdx.x, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int n = p.key_counts[query];
  if (n <= p.k || slice * kIndexerTopkSliceKeys >= n) return;
  const SliceWarp sw(p, query, n, slice, warp, lane);
  for (int i = tid; i < kTopkWarps * 256; i += kTopkThreads) (&low_hist[0][0])[i] = 0;
  if (warp == 0) {
    int above = 0;
    const int high = find_bin_warp(p.histogram + size_t(query) * 256, p.k, 0, &above);
    if (lane == 0) {
      shared_high = high;
      if (slice == 0) p.high_bin[query] = high;
    }
  }
  __syncthreads();
  const uint32_t high = shared_high, high_end = (high + 1) << 8;
  int greater = 0;
  sw.for_steps(lane, [&](auto full, int i, const uint4& v) {
    uint32_t key[8];
    bool valid[8];
    unpack_keys<decltype(full)::value>(v, i, sw.end, key, valid);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (valid[e] && (key[e] >> 8) == high) atomicAdd(&low_hist[warp][key[e] & 255], 1);
      greater += valid[e] && key[e] >= high_end;
    }
  });
  greater = __reduce_add_sync(0xffffffffu, greater);
  if (lane == 0) warp_greater[warp] = greater;
  __syncthreads();
  const size_t at = size_t(query) * p.max_slices + slice;
  for (int b = tid; b < 256; b += kTopkThreads) {
    int total = 0;
#pragma unroll
    for (int w = 0; w < kTopkWarps; ++w) total += low_hist[w][b];
    p.slice_hist[at * 256 + b] = total;
  }
  if (warp == 0) {
    const int g = __reduce_add_sync(0xffffffffu, lane < kTopkWarps ? warp_greater[lane] : 0);
    if (lane == 0) p.slice_greater[at] = g;
  }
}

// Top-k, second kernel: grid (slices, queries). Every slice sums the per-slice counts into the
// threshold (the k-th largest key) and how many ties are taken (lowest indices first), and the
// counts of the slices before it into where its selections start; its warps count their keys above
// and at the threshold, and from those prefix sums each warp writes its selections in index order.
__global__ void __launch_bounds__(kTopkThreads) indexer_topk_collect_kernel(const TopkParams p) {
  __shared__ int sum_hist[256], before_hist[256];
  __shared__ int warp_greater[kTopkWarps], warp_ties[kTopkWarps];
  __shared__ int shared_vals[4];
  pdl_wait();  // the count kernel's per-slice results
  const int query = blockIdx.y, slice = blockIdx.x, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int n = p.key_counts[query], k = p.k;
  int32_t* out = p.topk + size_t(query) * k;
  // The count kernel, the histogram's last reader, has completed: clear it for the next scores call.
  if (slice == 0 && tid < 256) p.histogram[size_t(query) * 256 + tid] = 0;
  if (n <= k) {  // everything is taken
    if (slice == 0)
      for (int i = tid; i < k; i += kTopkThreads) out[i] = i < n ? i : -1;
    return;
  }
  if (slice * kIndexerTopkSliceKeys >= n) return;
  const int slices = (n + kIndexerTopkSliceKeys - 1) / kIndexerTopkSliceKeys;
  const SliceWarp sw(p, query, n, slice, warp, lane);
  const int32_t* sh = p.slice_hist + size_t(query) * p.max_slices * 256;
  const int32_t* sg = p.slice_greater + size_t(query) * p.max_slices;
  for (int b = tid; b < 256; b += kTopkThreads) {
    int total = 0, before = 0;
#pragma unroll 8
    for (int s = 0; s < slices; ++s) {  // independent loads: unrolled so that they overlap
      const int h = sh[s * 256 + b];
      total += h;
      before += s < slice ? h : 0;
    }
    sum_hist[b] = total;
    before_hist[b] = before;
  }
  __syncthreads();
  if (warp == 0) {
    int above_high = 0, greater_before = 0;
    for (int s = lane; s < slices; s += 32) {
      const int g = sg[s];
      above_high += g;
      greater_before += s < slice ? g : 0;
    }
    above_high = __reduce_add_sync(0xffffffffu, above_high);
    int above = 0;
    const int low = find_bin_warp(sum_hist, k, above_high, &above);
    for (int b = low + 1 + lane; b < 256; b += 32) greater_before += before_hist[b];
    greater_before = __reduce_add_sync(0xffffffffu, greater_before);
    if (lane == 0) {
      shared_vals[0] = low;
      shared_vals[1] = above;
      shared_vals[2] = greater_before;
      shared_vals[3] = before_hist[low];
    }
  }
  __syncthreads();
  const uint32_t threshold = (uint32_t(p.high_bin[query]) << 8) | uint32_t(shared_vals[0]);
  const int take_equal = k - shared_vals[1];  // ties taken, lowest indices first (≥ 1)
  {
    int greater = 0, ties = 0;
    sw.for_steps(lane, [&](auto full, int i, const uint4& v) {
      uint32_t key[8];
      bool valid[8];
      unpack_keys<decltype(full)::value>(v, i, sw.end, key, valid);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        greater += valid[e] && key[e] > threshold;
        ties += valid[e] && key[e] == threshold;
      }
    });
    greater = __reduce_add_sync(0xffffffffu, greater);
    ties = __reduce_add_sync(0xffffffffu, ties);
    if (lane == 0) { warp_greater[warp] = greater; warp_ties[warp] = ties; }
  }
  __syncthreads();
  // Prefix sums over the slices before this one and this slice's warps (lane v ↔ warp v).
  int pos, tie_rank;
  {
    const int g = lane < kTopkWarps ? warp_greater[lane] : 0, t = lane < kTopkWarps ? warp_ties[lane] : 0;
    int incl_g = g, incl_t = t;
    for (int o = 1; o < 32; o <<= 1) {
      const int yg = __shfl_up_sync(0xffffffffu, incl_g, o), yt = __shfl_up_sync(0xffffffffu, incl_t, o);
      if (lane >= o) { incl_g += yg; incl_t += yt; }
    }
    const int before_g = shared_vals[2] + __shfl_sync(0xffffffffu, incl_g - g, warp);
    tie_rank = shared_vals[3] + __shfl_sync(0xffffffffu, incl_t - t, warp);  // rank of this warp's first tie
    pos = before_g + min(take_equal, tie_rank);  // where this warp's first selection goes
  }
  sw.for_steps(lane, [&](auto full, int i, const uint4& v) {
    uint32_t key[8];
    bool valid[8];
    unpack_keys<decltype(full)::value>(v, i, sw.end, key, valid);
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
  });
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
      max_slices_(std::max(1, (max_keys + kIndexerTopkSliceKeys - 1) / kIndexerTopkSliceKeys)),
      scores_(size_t(max_queries) * score_stride_),
      histogram_(size_t(max_queries) * 256),
      slice_hist_(size_t(max_queries) * max_slices_ * 256),
      slice_greater_(size_t(max_queries) * max_slices_),
      high_bin_(max_queries) {
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
  DSV4_CHECK(a.num_queries <= ws.max_queries() && a.max_keys <= ws.max_keys(),
             "indexer: {} queries × {} keys exceed the workspace", a.num_queries, a.max_keys);
  if (a.max_keys <= 0) {  // no keys anywhere: every row is −1 padding
    DSV4_CUDA_CHECK(cudaMemsetAsync(a.topk, 0xff, size_t(a.num_queries) * a.k * sizeof(int32_t), stream));
    return;
  }
  const TopkParams p{ws.scores(), ws.score_stride(), ws.histogram(), ws.slice_hist(), ws.slice_greater(),
                     ws.high_bin(), ws.max_slices(), a.key_counts, a.k, a.topk};
  const dim3 grid((a.max_keys + kIndexerTopkSliceKeys - 1) / kIndexerTopkSliceKeys, a.num_queries);
  launch_programmatic(indexer_topk_count_kernel, grid, dim3(kTopkThreads), 0, stream, p);
  launch_programmatic(indexer_topk_collect_kernel, grid, dim3(kTopkThreads), 0, stream, p);
}

void indexer_topk(const IndexerWorkspace& ws, const IndexerArgs& a, cudaStream_t stream) {
  indexer_scores(ws, a, stream);
  indexer_select_topk(ws, a, stream);
}

}  // namespace dsv4::cuda
