// Split-KV sparse-MLA decode (SPEC §3.6) on the FP8 paged cache, with mma.sync bf16 tensor cores
// (sm_80+ instructions, so the same code builds for sm_90a and sm_120a).
//
// A CTA handles one job = (query token, group of 16/32/64 heads) over a range of blocks of kBlock
// (64 or 32) positions of the query's entry list. Per block:
//   1. cp.async the raw entries (576 B + 8 scale bytes each; −1 slots zero-filled) into smem, one
//      warp instruction per 512 contiguous bytes, overlapping the previous block's math;
//   2. dequantise FP8 → bf16 into a [kBlock × 512] tile (every value converted once per CTA);
//   3. warp (row group r, half c) computes S = Q[16 heads] · K[kBlock/2 entries]ᵀ over 512 dims, the
//      two warps of a row group exchange row maxima, compute p = exp(s − m) in f32, round P to bf16
//      and exchange it through smem;
//   4. the same warp accumulates O[16 heads, 256 dims of half c] += P[16 × kBlock] · V[kBlock × 256].
// Keys = values, so the bf16 tile is read as K (ldmatrix) and as V (ldmatrix.trans).
// The plan (sparse_mla_plan.cu) gives each CTA a contiguous range of blocks; jobs cut between CTAs
// write f32 partials (m, l, acc) and a combine kernel merges them with exp(m_i − m) weights. Both
// kernels are launched as programmatic dependents (PDL) so their launch latency hides behind the
// kernel before them; each waits for it before reading anything.
// With reference_rounding a first launch of the same kernel (max_pass) walks the pieces for their
// score maxima only, and the second starts each piece from the maximum of the job's earlier pieces,
// so every block's P is rounded against the running maximum a walk over the whole list has there.
// kBlock is also the online-softmax block: 64 is the reference's; 32 (small batches: twice the CTAs
// per list, and the tile that fits sm_120's shared memory) rounds P against a running max that may
// be updated mid-block, which is within bf16 rounding of the reference, as a split already is.
#include "backend/cuda/sparse_mla_decode.h"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/ptx_primitives.cuh"
#include "backend/cuda/sparse_mla_kernels.cuh"
#include "backend/kv_cache_layout.h"

namespace dsv4::cuda {

int sparse_mla_ctas_per_sm(int heads_per_cta, int block_entries, int row_group_warps);

namespace {

using sparse_mla_detail::KernelParams;
using sparse_mla_detail::dequant16;
using sparse_mla_detail::pack_bf16;
namespace kl = dsv4::kv_layout;
constexpr int kD = kl::kHeadDim;     // 512
constexpr int kRowBytes = kD * 2 + 16;        // bf16 row + 16 B: ldmatrix's 8 rows hit 8 distinct bank groups
constexpr int kRawRowBytes = kl::kEntryDataBytes + 16;  // 592: the dequantiser's lanes (one entry each) hit distinct banks
constexpr int kChunksPerEntry = kl::kEntryDataBytes / 16;  // 36 × 16 B: 28 e4m3 (nope) + 8 bf16 (rope)
constexpr int kNopeChunks = kl::kNopeDim / 16;
static_assert(kl::kNopeDim % 64 == 0 && kChunksPerEntry == 36, "entry layout");

// kSplit warps share each 16-head row group: warp c of the group takes entries
// [c·kBlock/kSplit, (c+1)·kBlock/kSplit) of S = Q·Kᵀ and dims [c·512/kSplit, …) of O = P·V.
template <int kHeads, int kBlock, int kSplit>
struct Layout {
  static constexpr int kRowGroups = kHeads / 16;
  static constexpr int kWarps = kSplit * kRowGroups;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWarpEntries = kBlock / kSplit;  // entries per warp in S
  static constexpr int kNTiles = kWarpEntries / 8;      // n8 tiles of S per warp
  static constexpr int kWarpDims = kD / kSplit;         // output dims per warp
  static constexpr int kDimTiles = kWarpDims / 8;       // n8 tiles of O per warp
  static constexpr int kPRowBytes = kBlock * 2 + 16;
  static constexpr int q = 0;
  static constexpr int kv = q + kHeads * kRowBytes;
  static constexpr int raw = kv + kBlock * kRowBytes;
  static constexpr int raw_scales = raw + kBlock * kRawRowBytes;
  static constexpr int p = raw_scales + kBlock * 8;
  static constexpr int row_max = p + kHeads * kPRowBytes;  // [kSplit][kHeads] f32
  static constexpr int row_sum = row_max + kSplit * kHeads * 4;
  static constexpr int src = row_sum + kSplit * kHeads * 4;  // [2 parities][kBlock] entry data pointers (null = none)
  static constexpr int ids = src + 2 * kBlock * 8;           // [2 parities][kBlock] entry ids (−1 = none)
  static constexpr int bytes = ids + 2 * kBlock * 4;
  static_assert(kBlock == 32 || kBlock == 64, "block of 32 or 64 positions");
  static_assert((kSplit == 2 || kSplit == 4 || kSplit == 8) && kNTiles >= 1, "2, 4 or 8 warps per row group, ≥ 8 entries each");
  static_assert(kWarpDims * kSplit == kD && kDimTiles % 2 == 0, "whole 16-dim steps of O per warp");
};

// ---- PTX wrappers ---------------------------------------------------------------------------------
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// Barrier among the warps of one row group; id 0 is __syncthreads'.
__device__ __forceinline__ void group_barrier(int row_group, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(row_group + 1), "r"(threads) : "memory");
}

// Merges the `n` partials of one job's head `hl` over one of its kSlices dim slices, a warp per
// slice (lane l: kDims dims from slice·512/kSlices + l·kDims):
// o = Σ w_i acc_i / (Σ w_i l_i + exp(sink − M)), w_i = exp(m_i − M), M = max_i m_i, in one pass
// with a running maximum (the running sums are rescaled whenever it grows). The loads of kBatch
// pieces are issued together (a few memory latencies, not one per piece); a lane's dims share the
// index math and the weights, which is where the merge's time went with 4 dims per thread at large
// batch. Few jobs take more slices (more warps, more pieces per load batch), many jobs fewer.
// L2 loads (__ldcg): the partials come from other CTAs.
template <int kSlices>
__device__ __forceinline__ void combine_head(const KernelParams& p, int heads_per_cta, int job, int first, int n,
                                             int hl, int slice, int lane) {
  constexpr int kDims = 16 / kSlices, kVecs = kDims / 4, kBatch = 4 * kSlices;
  const int dim0 = slice * (512 / kSlices) + lane * kDims;
  const float2* ml_of = p.plan.partial_ml + size_t(first) * heads_per_cta + hl;
  const float4* acc_of =
      reinterpret_cast<const float4*>(p.plan.partial_acc + (size_t(first) * heads_per_cta + hl) * 512 + dim0);
  const size_t acc_stride = size_t(heads_per_cta) * 512 / 4;
  const int query = job / p.head_groups, head = (job % p.head_groups) * heads_per_cta + hl;
  const float sink = p.a.sink[head];
  float mu = -INFINITY, sum = 0.f;
  float acc[kDims];
#pragma unroll
  for (int d = 0; d < kDims; ++d) acc[d] = 0.f;
  for (int i0 = 0; i0 < n; i0 += kBatch) {
    float2 ml[kBatch];
    float4 v[kBatch][kVecs];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const bool ok = i0 + j < n;
      ml[j] = ok ? __ldcg(ml_of + size_t(i0 + j) * heads_per_cta) : make_float2(-INFINITY, 0.f);
#pragma unroll
      for (int c = 0; c < kVecs; ++c)
        v[j][c] = ok ? __ldcg(acc_of + (i0 + j) * acc_stride + c) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float m_batch = mu;
#pragma unroll
    for (int j = 0; j < kBatch; ++j) m_batch = fmaxf(m_batch, ml[j].x);
    const float m_use = m_batch == -INFINITY ? 0.f : m_batch;
    const float rescale = __expf(mu - m_use);  // 0 while nothing was merged (mu = −inf)
    sum *= rescale;
#pragma unroll
    for (int d = 0; d < kDims; ++d) acc[d] *= rescale;
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const float w = __expf(ml[j].x - m_use);  // 0 for padding and empty pieces
      sum += w * ml[j].y;
#pragma unroll
      for (int c = 0; c < kVecs; ++c) {
        acc[4 * c] += w * v[j][c].x;
        acc[4 * c + 1] += w * v[j][c].y;
        acc[4 * c + 2] += w * v[j][c].z;
        acc[4 * c + 3] += w * v[j][c].w;
      }
    }
    mu = m_batch;
  }
  const float m_final = mu == -INFINITY ? 0.f : mu;
  const float inv = 1.f / (sum + __expf(sink - m_final));
  uint2* dst = reinterpret_cast<uint2*>(p.a.out + (size_t(query) * p.n_heads + head) * 512 + dim0);
#pragma unroll
  for (int k = 0; k < kDims / 4; ++k)
    dst[k] = make_uint2(pack_bf16(acc[4 * k] * inv, acc[4 * k + 1] * inv),
                        pack_bf16(acc[4 * k + 2] * inv, acc[4 * k + 3] * inv));
}

// ---- One piece: job × [block_begin, block_end) --------------------------------------------------
// kMaxPass: reference_rounding's first launch — the piece's score maxima only (KernelParams).
template <int kHeads, int kBlock, int kSplit, bool kMaxPass>
__device__ void run_piece(const KernelParams& p, uint8_t* smem, int job, int block_begin, int block_end,
                          int partial_slot) {
  using L = Layout<kHeads, kBlock, kSplit>;
  const SparseMlaArgs& a = p.a;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int r = warp % L::kRowGroups, c = warp / L::kRowGroups;  // row group (16 heads), part
  const int group_threads = 32 * kSplit;
  const int gid = lane / 4, tig = lane % 4;
  const int query = job / p.head_groups, head0 = (job % p.head_groups) * kHeads;
  const int len = a.list_lengths ? min(a.list_lengths[query], a.list_stride) : a.list_stride;
  const int32_t* list = a.lists + size_t(query) * a.list_stride;
  int32_t* ids = reinterpret_cast<int32_t*>(smem + L::ids);
  float* row_max = reinterpret_cast<float*>(smem + L::row_max);
  float* row_sum = reinterpret_cast<float*>(smem + L::row_sum);
  const uint32_t s_q = smem_u32(smem + L::q), s_kv = smem_u32(smem + L::kv), s_p = smem_u32(smem + L::p);
  const uint32_t s_raw = smem_u32(smem + L::raw), s_raw_scales = smem_u32(smem + L::raw_scales);
  // Whole list in this CTA: the sink of the two heads this thread writes, loaded now rather than
  // after the last block, where its memory round trip ended the kernel (~1 µs of a decode step's
  // one-query attention, docs/perf/2026-12-06-attention-cluster.md). Not in the 512-thread CTA,
  // whose 128-register budget has no room for them over the loop.
  constexpr bool kEarlySink = !kMaxPass && L::kThreads <= 256;
  float sink[2] = {0.f, 0.f};
  if (kEarlySink && partial_slot < 0)
#pragma unroll
    for (int h = 0; h < 2; ++h) sink[h] = a.sink[head0 + 16 * r + gid + 8 * h];

  // Entry id of list position `pos` (−1 past the list's length), read by threads 0..kBlock-1. The
  // load does not wait for the length (any position inside the row may be read).
  auto entry_id = [&](int pos) -> int32_t {
    const int32_t g = pos < a.list_stride ? list[pos] : -1;
    return pos < len ? g : -1;
  };
  // Stores the id of position `pos` and its entry's data address (null for none) in slot `parity`.
  const uint8_t** srcs = reinterpret_cast<const uint8_t**>(smem + L::src);
  auto stage_entry = [&](int pos, int32_t g, int parity) {
    const uint8_t* pool = pos < a.window_len ? a.window_pool : a.compressed_pool;
    ids[parity * kBlock + tid] = g;
    srcs[parity * kBlock + tid] = g >= 0 ? pool + kl::kv_entry_data_offset(g) : nullptr;
  };
  // Issues the cp.async of one staged block. Warp w copies entries w, w + kWarps, …: lanes 0–31
  // its first 512 bytes, lanes 0–3 the last 64, lane 4 the scale bytes (at a fixed offset from the
  // data in the entry's page), so each instruction reads contiguous memory.
  constexpr int kLoopUnroll = kSplit == 4 ? 1 : 2;  // 1: the 512-thread CTA's 128-register budget
  auto issue_block_load = [&](int parity) {
#pragma unroll kLoopUnroll
    for (int e = warp; e < kBlock; e += L::kWarps) {
      const uint8_t* src = srcs[parity * kBlock + e];
      const bool ok = src != nullptr;
      // Missing entries are zero-filled (src size 0) so that P·V sees finite zeros.
      if (!ok) src = reinterpret_cast<const uint8_t*>(list);
      const uint32_t dst = s_raw + e * kRawRowBytes;
      cp_async16(dst + lane * 16, src + (ok ? lane * 16 : 0), ok ? 16 : 0);
      if (lane < 4) {
        cp_async16(dst + 512 + lane * 16, src + (ok ? 512 + lane * 16 : 0), ok ? 16 : 0);
      } else if (lane == 4) {
        cp_async8(s_raw_scales + e * 8, ok ? src + kl::kv_scale_from_data_delta(ids[parity * kBlock + e]) : src,
                  ok ? 8 : 0);
      }
    }
    cp_async_commit();
  };

  __syncthreads();  // the previous piece is done with every buffer
  if (tid < kBlock) stage_entry(block_begin * kBlock + tid, entry_id(block_begin * kBlock + tid), 0);
  {
    const __nv_bfloat16* q_src = a.q + (size_t(query) * p.n_heads + head0) * kD;
    for (int i = tid; i < kHeads * (kD / 8); i += L::kThreads)
      cp_async16(s_q + (i / (kD / 8)) * kRowBytes + (i % (kD / 8)) * 16, q_src + size_t(i) * 8, 16);
  }
  __syncthreads();
  issue_block_load(0);

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  if (!kMaxPass && p.reference_rounding && partial_slot >= 0) {
    // Start from the running maximum of the job's blocks before this piece (the maxima of its earlier
    // pieces, from the max pass): P then rounds against the maxima a walk over the whole list meets.
    for (int sl = p.plan.job_first_piece[job]; sl < partial_slot; ++sl)
#pragma unroll
      for (int h = 0; h < 2; ++h) m[h] = fmaxf(m[h], p.plan.piece_max[size_t(sl) * kHeads + 16 * r + gid + 8 * h]);
  }
  float o[L::kDimTiles][4];
#pragma unroll
  for (int i = 0; i < L::kDimTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

  for (int block = block_begin; block < block_end; ++block) {
    const int parity = (block - block_begin) & 1;
    // The next block's ids: loaded now, their latency hidden behind the wait and the dequantisation.
    const int32_t next_id = tid < kBlock && block + 1 < block_end ? entry_id((block + 1) * kBlock + tid) : -1;
    cp_async_wait_all();
    __syncthreads();
    // Dequantise, one 16-byte chunk per item: lanes take consecutive entries of one chunk (the chunk,
    // hence the branch, is warp-uniform), nope chunks become 16 bf16, rope chunks are copied.
#pragma unroll kLoopUnroll
    for (int i = tid; i < kBlock * kChunksPerEntry; i += L::kThreads) {
      const int e = i % kBlock, chunk = i / kBlock;
      const uint4 v = *reinterpret_cast<const uint4*>(smem + L::raw + e * kRawRowBytes + chunk * 16);
      uint8_t* dst_row = smem + L::kv + e * kRowBytes;
      if (chunk < kNopeChunks) {
        uint4 lo, hi;
        dequant16(v, smem[L::raw_scales + e * 8 + chunk / 4], lo, hi);
        *reinterpret_cast<uint4*>(dst_row + chunk * 32) = lo;
        *reinterpret_cast<uint4*>(dst_row + chunk * 32 + 16) = hi;
      } else {
        *reinterpret_cast<uint4*>(dst_row + kl::kNopeDim * 2 + (chunk - kNopeChunks) * 16) = v;
      }
    }
    if (tid < kBlock) stage_entry((block + 1) * kBlock + tid, next_id, parity ^ 1);
    __syncthreads();
    if (block + 1 < block_end) issue_block_load(parity ^ 1);

    // S = Q · Kᵀ: 16 heads × kWarpEntries entries (this warp's part of the block), k = 512.
    float s[L::kNTiles][4];
#pragma unroll
    for (int i = 0; i < L::kNTiles; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
    const int mi = lane >> 3;
    const uint32_t q_addr = s_q + (16 * r + (lane & 15)) * kRowBytes + (lane >> 4) * 16;
    const uint32_t k_row0 = s_kv + L::kWarpEntries * c * kRowBytes;
    constexpr int kQkUnroll = kSplit == 4 ? 2 : 8;  // 2: the 512-thread CTA's 128-register budget
#pragma unroll kQkUnroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      uint32_t qa[4];
      ldsm_x4(qa, q_addr + ks * 32);
      if constexpr (L::kNTiles == 1) {
        uint32_t kb[2];
        ldsm_x2(kb, k_row0 + (lane & 7) * kRowBytes + ((lane >> 3) & 1) * 16 + ks * 32);
        mma_bf16(s[0], qa, kb[0], kb[1]);
      } else {
#pragma unroll
        for (int j = 0; j < L::kNTiles / 2; ++j) {
          uint32_t kb[4];
          ldsm_x4(kb, k_row0 + (j * 16 + (mi >> 1) * 8 + (lane & 7)) * kRowBytes + (mi & 1) * 16 + ks * 32);
          mma_bf16(s[2 * j], qa, kb[0], kb[1]);
          mma_bf16(s[2 * j + 1], qa, kb[2], kb[3]);
        }
      }
    }
    // Scale, mask, row maxima over the whole block (all parts).
    const int32_t* ok = ids + parity * kBlock;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < L::kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool v = ok[L::kWarpEntries * c + nt * 8 + 2 * tig + e] >= 0;
        s[nt][e] = v ? s[nt][e] * a.scale : -INFINITY;
        s[nt][2 + e] = v ? s[nt][2 + e] * a.scale : -INFINITY;
        mx[0] = fmaxf(mx[0], s[nt][e]);
        mx[1] = fmaxf(mx[1], s[nt][2 + e]);
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      if (tig == 0) row_max[c * kHeads + 16 * r + gid + 8 * h] = mx[h];
    }
    group_barrier(r, group_threads);
    float alpha[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m_new = fmaxf(m[h], mx[h]);
#pragma unroll
      for (int o2 = 1; o2 < kSplit; ++o2)
        m_new = fmaxf(m_new, row_max[((c + o2) % kSplit) * kHeads + 16 * r + gid + 8 * h]);
      m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // nothing valid yet: keep the state empty
      alpha[h] = __expf(m[h] - m_use[h]);
      m[h] = m_new;
    }
    if constexpr (!kMaxPass) {  // the max pass wants the maxima only
    // p in f32 (sum in f32), rounded to bf16 for P·V (SPEC §3.11.6).
    float psum[2] = {0.f, 0.f};
    uint8_t* p_row = smem + L::p + (16 * r + gid) * L::kPRowBytes + (L::kWarpEntries * c + 2 * tig) * 2;
#pragma unroll
    for (int nt = 0; nt < L::kNTiles; ++nt) {
      const float p0 = __expf(s[nt][0] - m_use[0]), p1 = __expf(s[nt][1] - m_use[0]);
      const float p2 = __expf(s[nt][2] - m_use[1]), p3 = __expf(s[nt][3] - m_use[1]);
      psum[0] += p0 + p1;
      psum[1] += p2 + p3;
      *reinterpret_cast<uint32_t*>(p_row + nt * 16) = pack_bf16(p0, p1);
      *reinterpret_cast<uint32_t*>(p_row + 8 * L::kPRowBytes + nt * 16) = pack_bf16(p2, p3);
    }
    l[0] = l[0] * alpha[0] + psum[0];
    l[1] = l[1] * alpha[1] + psum[1];
    // Once the running maxima settle every alpha is exactly 1 (exp(0)); skipping is then exact.
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int nt = 0; nt < L::kDimTiles; ++nt) {
        o[nt][0] *= alpha[0];
        o[nt][1] *= alpha[0];
        o[nt][2] *= alpha[1];
        o[nt][3] *= alpha[1];
      }
    }
    group_barrier(r, group_threads);
    // O[16 heads, kWarpDims dims of part c] += P[16 × kBlock] · V[kBlock × kWarpDims].
    const uint32_t p_addr = s_p + (16 * r + (lane & 15)) * L::kPRowBytes + (lane >> 4) * 16;
    const uint32_t v_addr =
        s_kv + ((mi & 1) * 8 + (lane & 7)) * kRowBytes + (L::kWarpDims * c + (mi >> 1) * 8) * 2;
#pragma unroll
    for (int ks = 0; ks < kBlock / 16; ++ks) {
      uint32_t pa[4];
      ldsm_x4(pa, p_addr + ks * 32);
#pragma unroll
      for (int j = 0; j < L::kDimTiles / 2; ++j) {
        uint32_t vb[4];
        ldsm_x4_trans(vb, v_addr + ks * 16 * kRowBytes + j * 32);
        mma_bf16(o[2 * j], pa, vb[0], vb[1]);
        mma_bf16(o[2 * j + 1], pa, vb[2], vb[3]);
      }
    }
    }  // !kMaxPass
  }

  if constexpr (kMaxPass) {
    if (c == 0 && tig == 0)
#pragma unroll
      for (int h = 0; h < 2; ++h) p.plan.piece_max[size_t(partial_slot) * kHeads + 16 * r + gid + 8 * h] = m[h];
  } else {
  // Row sums: the quad, then the group's other warps (the other parts of every block).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if (tig == 0) row_sum[c * kHeads + 16 * r + gid + 8 * h] = l[h];
  }
  group_barrier(r, group_threads);
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int o2 = 1; o2 < kSplit; ++o2) l[h] += row_sum[((c + o2) % kSplit) * kHeads + 16 * r + gid + 8 * h];

  const int dim0 = L::kWarpDims * c + 2 * tig;
  if (partial_slot < 0) {
    // Whole list in this CTA: add the sink (a logit with a zero value vector) and write bf16.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = head0 + 16 * r + gid + 8 * h;
      const float mu = m[h] == -INFINITY ? 0.f : m[h];
      const float inv = 1.f / (l[h] + __expf((kEarlySink ? sink[h] : a.sink[head]) - mu));
      __nv_bfloat16* dst = a.out + (size_t(query) * p.n_heads + head) * kD + dim0;
#pragma unroll
      for (int nt = 0; nt < L::kDimTiles; ++nt)
        *reinterpret_cast<uint32_t*>(dst + nt * 8) = pack_bf16(o[nt][2 * h] * inv, o[nt][2 * h + 1] * inv);
    }
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int hl = 16 * r + gid + 8 * h;
      float* dst = p.plan.partial_acc + (size_t(partial_slot) * kHeads + hl) * kD + dim0;
#pragma unroll
      for (int nt = 0; nt < L::kDimTiles; ++nt)
        *reinterpret_cast<float2*>(dst + nt * 8) = make_float2(o[nt][2 * h], o[nt][2 * h + 1]);
      if (c == 0 && tig == 0) p.plan.partial_ml[size_t(partial_slot) * kHeads + hl] = make_float2(m[h], l[h]);
    }
    if (kSplit == 2 && p.fused_combine) {  // the plan allows it only there
      // The last CTA to finish a piece of this job merges all its partials (threadfence reduction).
      // One CTA then reads every partial of the job (at batch 1, 10–40 pieces × heads × 2 KB), which
      // is why the separate combine kernel, spread over many CTAs, is the default.
      __shared__ int is_last;
      __threadfence();
      __syncthreads();
      if (tid == 0) {
        const int pieces = p.plan.job_first_piece[job + 1] - p.plan.job_first_piece[job];
        is_last = atomicAdd(&p.plan.job_done[job], 1) == pieces - 1;
      }
      __syncthreads();
      if (is_last) {
        __threadfence();
        const int first = p.plan.job_first_piece[job], n = p.plan.job_first_piece[job + 1] - first;
        for (int h = warp; h < kHeads; h += L::kThreads / 32) combine_head<1>(p, kHeads, job, first, n, h, 0, lane);
        if (tid == 0) p.plan.job_done[job] = 0;  // ready for the next launch (graph replays)
      }
    }
  }
}  // !kMaxPass
}

// sm_120 (RTX PRO 6000) gives a block at most 99 KB of shared memory: configurations that need more
// are never launched there (the plan checks the device), so their bodies are not compiled for it.
template <int kBytes>
__device__ constexpr bool fits_this_arch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
  return kBytes <= 99 * 1024;
#else
  return true;
#endif
}

template <int kHeads, int kBlock, int kSplit, bool kMaxPass = false>
__global__ void __launch_bounds__(Layout<kHeads, kBlock, kSplit>::kThreads, 1)
    sparse_mla_decode_kernel(const KernelParams p) {
  if constexpr (!fits_this_arch<Layout<kHeads, kBlock, kSplit>::bytes>()) {
    __trap();
  } else {
  extern __shared__ __align__(16) uint8_t smem[];
  // Settled plan tables are read before the wait: a split CTA's start is otherwise a chain of three
  // dependent loads after it (its first piece; the max pass's test of its job's last piece; the list).
  const bool early = p.split && p.plan.settled;
  sparse_mla_detail::PieceStart start{};
  int first_job_end_piece = -1;  // the max pass: job_first_piece[first job + 1], where read early
  if (early) {
    start = sparse_mla_detail::load_piece_start(p);
    if (kMaxPass && start.first.x >= 0) first_job_end_piece = p.plan.job_first_piece[start.first.x + 1];
  }
  pdl_wait();  // q, lists and the plan come from earlier kernels
  pdl_launch_dependents();  // the combine kernel may take idle SMs now; it waits for this grid
  if (!p.split) {  // baseline: CTA = job, whole list
    const int job = blockIdx.x;
    if (job >= p.jobs) return;
    const int query = job / p.head_groups;
    const int len = p.a.list_lengths ? min(p.a.list_lengths[query], p.a.list_stride) : p.a.list_stride;
    run_piece<kHeads, kBlock, kSplit, false>(p, smem, job, 0, max(1, (len + kBlock - 1) / kBlock), -1);
    return;
  }
  if (!early) start = sparse_mla_detail::load_piece_start(p);
  sparse_mla_detail::for_each_piece(p, start, [&](int job, int begin, int end, int slot, bool) {
    // The max pass skips what no later piece needs: whole jobs and each job's last piece.
    if (kMaxPass && (slot < 0 || slot == (job == start.first.x && first_job_end_piece >= 0
                                              ? first_job_end_piece
                                              : p.plan.job_first_piece[job + 1]) - 1))
      return;
    run_piece<kHeads, kBlock, kSplit, kMaxPass>(p, smem, job, begin, end, slot);
  });
  }
}

// Merges the partials of every job cut between CTAs: o = Σ w_i acc_i / (Σ w_i l_i + exp(sink − M)),
// w_i = exp(m_i − M). One warp per (job, head, dim slice), walked by a grid of at most two CTAs per
// decode CTA.
template <int kSlices>
__global__ void sparse_mla_combine_kernel(const KernelParams p, int heads_per_cta) {
  const int early_pieces = p.plan.settled ? p.plan.job_first_piece[p.jobs] : 0;  // (a settled table)
  pdl_wait();  // the decode kernel's partials
  pdl_launch_dependents();
  // No job cut between CTAs (as many pieces as jobs): nothing to merge. Without this exit every
  // warp would walk its share of the jobs, one dependent table load per item (~5 µs at 256 jobs).
  if ((p.plan.settled ? early_pieces : p.plan.job_first_piece[p.jobs]) == p.jobs) return;
  const int per_job = heads_per_cta * kSlices, items = p.jobs * per_job;
  const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
  for (int item = blockIdx.x * warps + threadIdx.x / 32; item < items; item += gridDim.x * warps) {
    const int job = item / per_job, rest = item % per_job;
    const int first = p.plan.job_first_piece[job], n = p.plan.job_first_piece[job + 1] - first;
    if (n > 1) combine_head<kSlices>(p, heads_per_cta, job, first, n, rest / kSlices, rest % kSlices, lane);
  }
}

// The kernel instances: heads per CTA × block entries × warps per row group.
template <int kHeads, int kBlock, int kSplit>
struct Config {
  using L = Layout<kHeads, kBlock, kSplit>;
  static void launch(int grid, const KernelParams& kp, cudaStream_t stream) {
    if (kp.max_pass)
      launch_programmatic(sparse_mla_decode_kernel<kHeads, kBlock, kSplit, true>, dim3(grid), dim3(L::kThreads), L::bytes,
                          stream, kp);
    else
      launch_programmatic(sparse_mla_decode_kernel<kHeads, kBlock, kSplit>, dim3(grid), dim3(L::kThreads), L::bytes,
                          stream, kp);
  }
  static int ctas_per_sm() {
    const int optin = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    if (L::bytes > optin) return 0;  // sparse_mla_select_tile never picks it
    allow_dynamic_smem(sparse_mla_decode_kernel<kHeads, kBlock, kSplit>, L::bytes);
    allow_dynamic_smem(sparse_mla_decode_kernel<kHeads, kBlock, kSplit, true>, L::bytes);
    int blocks = 0;
    DSV4_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &blocks, sparse_mla_decode_kernel<kHeads, kBlock, kSplit>, L::kThreads, L::bytes));
    return blocks;
  }
};

// Calls f.template operator()<Config<…>>() for the configuration (h, b, s).
template <typename F>
auto with_config(int heads_per_cta, int block_entries, int row_group_warps, F&& f) {
  const int key = heads_per_cta * 1000 + block_entries * 10 + row_group_warps;
  switch (key) {
    case 16322: return f(Config<16, 32, 2>{});
    case 16324: return f(Config<16, 32, 4>{});
    case 16642: return f(Config<16, 64, 2>{});
    case 16644: return f(Config<16, 64, 4>{});
    case 32322: return f(Config<32, 32, 2>{});
    case 32324: return f(Config<32, 32, 4>{});
    case 32642: return f(Config<32, 64, 2>{});
    case 32644: return f(Config<32, 64, 4>{});
    case 64322: return f(Config<64, 32, 2>{});
    case 64324: return f(Config<64, 32, 4>{});
    case 64642: return f(Config<64, 64, 2>{});
    case 16648: return f(Config<16, 64, 8>{});
    default: return f(Config<64, 64, 4>{});
  }
}

}  // namespace

SparseMlaTile sparse_mla_mma_tile(int heads_per_cta, int block_entries, int row_group_warps) {
  return with_config(heads_per_cta, block_entries, row_group_warps, [&](auto config) {
    using L = typename decltype(config)::L;
    return SparseMlaTile{false, heads_per_cta, block_entries, row_group_warps, L::kThreads, size_t(L::bytes)};
  });
}

// CTAs of one configuration that fit an SM of this GPU, 0 if its shared memory does not fit at all.
// Also sets the kernel's shared-memory limit, so that capture never has to.
int sparse_mla_ctas_per_sm(int heads_per_cta, int block_entries, int row_group_warps) {
  return with_config(heads_per_cta, block_entries, row_group_warps, [](auto config) { return config.ctas_per_sm(); });
}

bool sparse_mla_wgmma_available() { return sparse_mla_detail::sparse_mla_wgmma_supported(); }

void sparse_mla_decode(const SparseMlaPlan& plan, const SparseMlaArgs& args, cudaStream_t stream) {
  const int hpc = plan.heads_per_cta();
  DSV4_CHECK(args.num_queries <= plan.shape().max_queries, "sparse MLA: {} queries > plan max {}", args.num_queries,
             plan.shape().max_queries);
  if (args.num_queries == 0) return;
  KernelParams kp{args,
                  plan.view(),
                  plan.shape().n_heads,
                  plan.shape().n_heads / hpc,
                  0,
                  plan.shape().split_kv,
                  plan.shape().fused_combine};
  kp.jobs = args.num_queries * kp.head_groups;
  const int grid = kp.split ? plan.grid_ctas() : kp.jobs;
  kp.reference_rounding = kp.split && plan.shape().reference_rounding;
  if (kp.reference_rounding) {  // mma.sync only (the plan never picks wgmma with it)
    KernelParams max_pass = kp;
    max_pass.max_pass = true;
    with_config(hpc, plan.block_entries(), plan.row_group_warps(),
                [&](auto config) { config.launch(grid, max_pass, stream); });
  }
  if (plan.wgmma())
    sparse_mla_detail::sparse_mla_wgmma_launch(grid, kp, stream);
  else
    with_config(hpc, plan.block_entries(), plan.row_group_warps(),
                [&](auto config) { config.launch(grid, kp, stream); });
  if (kp.split && !kp.fused_combine) {
    // A warp per head at large batch (16 dims per lane, 4 pieces per load batch); at small batch 4
    // slices per head (4 dims per lane, 16 pieces per load batch), so that a handful of jobs still
    // spreads over ~32 SMs.
    const int heads = kp.jobs * hpc;
    const int slices = heads <= 256 ? 4 : 1;
    const int warps = sparse_mla_detail::kCombineThreads / 32;
    const int grid = std::min((heads * slices + warps - 1) / warps, 2 * plan.grid_ctas());
    launch_programmatic(slices == 4 ? sparse_mla_combine_kernel<4> : sparse_mla_combine_kernel<1>, dim3(grid),
                        dim3(sparse_mla_detail::kCombineThreads), 0, stream, kp, hpc);
  }
}

}  // namespace dsv4::cuda
