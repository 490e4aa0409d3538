// Split-KV sparse-MLA decode (SPEC §3.6) on the FP8 paged cache, with mma.sync bf16 tensor cores
// (sm_80+ instructions, so the same code builds for sm_90a and sm_120a).
//
// A CTA handles one job = (query token, group of 16/32/64 heads) over a range of 64-position blocks
// of the query's entry list. Per block:
//   1. cp.async the 64 raw entries (576 B + 8 scale bytes each; −1 slots zero-filled) into smem,
//      overlapping the previous block's math;
//   2. dequantise FP8 → bf16 into a [64 × 512] tile (every value converted once per CTA);
//   3. warp (row group r, half c) computes S = Q[16 heads] · K[32 entries]ᵀ over 512 dims, the two
//      warps of a row group exchange row maxima, compute p = exp(s − m) in f32, round P to bf16 and
//      exchange it through smem;
//   4. the same warp accumulates O[16 heads, 256 dims of half c] += P[16 × 64] · V[64 × 256].
// Keys = values, so the bf16 tile is read as K (ldmatrix) and as V (ldmatrix.trans).
// The plan (sparse_mla_plan.cu) gives each CTA a contiguous range of blocks; jobs cut between CTAs
// write f32 partials (m, l, acc) and a combine kernel merges them with exp(m_i − m) weights.
#include "backend/cuda/sparse_mla_decode.h"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/ptx_primitives.cuh"
#include "backend/kv_cache_layout.h"

namespace dsv4::cuda {

int sparse_mla_ctas_per_sm(int heads_per_cta);

namespace {

namespace kl = dsv4::kv_layout;
constexpr int kD = kl::kHeadDim;     // 512
constexpr int kBlock = 64;           // list positions per online-softmax block (reference's)
constexpr int kRowBytes = kD * 2 + 16;        // bf16 row + 16 B: ldmatrix's 8 rows hit 8 distinct bank groups
constexpr int kPRowBytes = kBlock * 2 + 16;
constexpr int kLoadItemsPerEntry = kl::kEntryDataBytes / 16 + 1;  // 36 data chunks + the scale bytes
constexpr int kDequantItemsPerEntry = kl::kNopeDim / 8 + kl::kRopeDim * 2 / 16;  // 56 nope × 8 + 8 rope × 16 B

template <int kHeads>
struct Layout {
  static constexpr int kRowGroups = kHeads / 16;
  static constexpr int kWarps = 2 * kRowGroups;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int q = 0;
  static constexpr int kv = q + kHeads * kRowBytes;
  static constexpr int raw = kv + kBlock * kRowBytes;
  static constexpr int raw_scales = raw + kBlock * kl::kEntryDataBytes;
  static constexpr int p = raw_scales + kBlock * 8;
  static constexpr int row_max = p + kHeads * kPRowBytes;  // [2 halves][kHeads] f32
  static constexpr int row_sum = row_max + 2 * kHeads * 4;
  static constexpr int ids = row_sum + 2 * kHeads * 4;     // [2 parities][64] entry ids (−1 = none)
  static constexpr int bytes = ids + 2 * kBlock * 4;
};

struct KernelParams {
  SparseMlaArgs a;
  SparseMlaPlan::View plan;
  int n_heads;
  int head_groups;
  int jobs;
  bool split;
  bool fused_combine;
};

// ---- PTX wrappers ---------------------------------------------------------------------------------
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// Barrier among the two warps (64 threads) of one row group; id 0 is __syncthreads'.
__device__ __forceinline__ void pair_barrier(int row_group) {
  asm volatile("bar.sync %0, 64;\n" ::"r"(row_group + 1) : "memory");
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&b);
}
// Two e4m3 (low byte first) times a power-of-two scale → bf16x2; exact (e4m3 · 2^k fits bf16).
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t two, float scale) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  return pack_bf16(f.x * scale, f.y * scale);
}
__device__ __forceinline__ float e8m0_to_float(uint8_t e) {
  return e == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(uint32_t(e) << 23);
}

// Merges the `n` partials of one job's head `hl` for the 4 dims at float4 index t:
// o = Σ w_i acc_i / (Σ w_i l_i + exp(sink − M)), w_i = exp(m_i − M). L2 loads (__ldcg): the
// partials come from other CTAs of the same launch.
__device__ __forceinline__ void combine_head_dims(const KernelParams& p, int heads_per_cta, int job, int first, int n,
                                                  int hl, int t) {
  float big = -INFINITY;
  for (int i = 0; i < n; ++i) big = fmaxf(big, __ldcg(&p.plan.partial_ml[size_t(first + i) * heads_per_cta + hl]).x);
  const float mu = big == -INFINITY ? 0.f : big;
  float sum = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int i = 0; i < n; ++i) {
    const float2 ml = __ldcg(&p.plan.partial_ml[size_t(first + i) * heads_per_cta + hl]);
    const float w = __expf(ml.x - mu);
    sum += w * ml.y;
    const float4 v =
        __ldcg(reinterpret_cast<const float4*>(p.plan.partial_acc + (size_t(first + i) * heads_per_cta + hl) * 512) + t);
    acc.x += w * v.x;
    acc.y += w * v.y;
    acc.z += w * v.z;
    acc.w += w * v.w;
  }
  const int query = job / p.head_groups, head = (job % p.head_groups) * heads_per_cta + hl;
  const float inv = 1.f / (sum + __expf(p.a.sink[head] - mu));
  const uint2 packed = make_uint2(pack_bf16(acc.x * inv, acc.y * inv), pack_bf16(acc.z * inv, acc.w * inv));
  reinterpret_cast<uint2*>(p.a.out + (size_t(query) * p.n_heads + head) * 512)[t] = packed;
}

// ---- One piece: job × [block_begin, block_end) --------------------------------------------------
template <int kHeads>
__device__ void run_piece(const KernelParams& p, uint8_t* smem, int job, int block_begin, int block_end,
                          int partial_slot) {
  using L = Layout<kHeads>;
  const SparseMlaArgs& a = p.a;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int r = warp % L::kRowGroups, c = warp / L::kRowGroups;  // row group (16 heads), half
  const int gid = lane / 4, tig = lane % 4;
  const int query = job / p.head_groups, head0 = (job % p.head_groups) * kHeads;
  const int len = a.list_lengths ? min(a.list_lengths[query], a.list_stride) : a.list_stride;
  const int32_t* list = a.lists + size_t(query) * a.list_stride;
  int32_t* ids = reinterpret_cast<int32_t*>(smem + L::ids);
  float* row_max = reinterpret_cast<float*>(smem + L::row_max);
  float* row_sum = reinterpret_cast<float*>(smem + L::row_sum);
  const uint32_t s_q = smem_u32(smem + L::q), s_kv = smem_u32(smem + L::kv), s_p = smem_u32(smem + L::p);
  const uint32_t s_raw = smem_u32(smem + L::raw), s_raw_scales = smem_u32(smem + L::raw_scales);

  // Entry id of list position `pos` (−1 past the list's length), read by threads 0..63.
  auto entry_id = [&](int pos) -> int32_t { return pos < len ? list[pos] : -1; };
  // Issues the cp.async of one block whose ids are already in smem (no dependent global loads).
  auto issue_block_load = [&](int block, int parity) {
    const int32_t* block_ids = ids + parity * kBlock;
    for (int i = tid; i < kBlock * kLoadItemsPerEntry; i += L::kThreads) {
      const int e = i / kLoadItemsPerEntry, part = i % kLoadItemsPerEntry;
      const int32_t g = block_ids[e];
      const bool ok = g >= 0;
      const uint8_t* pool = block * kBlock + e < a.window_len ? a.window_pool : a.compressed_pool;
      // Missing entries are zero-filled (src size 0) so that P·V sees finite zeros.
      if (part < kLoadItemsPerEntry - 1) {
        const void* src = ok ? static_cast<const void*>(pool + kl::kv_entry_data_offset(g) + part * 16) : list;
        cp_async16(s_raw + e * kl::kEntryDataBytes + part * 16, src, ok ? 16 : 0);
      } else {
        const void* src = ok ? static_cast<const void*>(pool + kl::kv_entry_scale_offset(g)) : list;
        cp_async8(s_raw_scales + e * 8, src, ok ? 8 : 0);
      }
    }
    cp_async_commit();
  };

  __syncthreads();  // the previous piece is done with every buffer
  {
    const __nv_bfloat16* q_src = a.q + (size_t(query) * p.n_heads + head0) * kD;
    for (int i = tid; i < kHeads * (kD / 8); i += L::kThreads)
      cp_async16(s_q + (i / (kD / 8)) * kRowBytes + (i % (kD / 8)) * 16, q_src + size_t(i) * 8, 16);
  }
  if (tid < kBlock) ids[tid] = entry_id(block_begin * kBlock + tid);
  __syncthreads();
  issue_block_load(block_begin, 0);

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[32][4];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

  for (int block = block_begin; block < block_end; ++block) {
    const int parity = (block - block_begin) & 1;
    // The next block's ids: loaded now, their latency hidden behind the wait and the dequantisation.
    const int32_t next_id = tid < kBlock && block + 1 < block_end ? entry_id((block + 1) * kBlock + tid) : -1;
    cp_async_wait_all();
    __syncthreads();
    // Dequantise: nope items convert 8 e4m3 → 8 bf16 (16 B store), rope items copy 16 B.
    for (int i = tid; i < kBlock * kDequantItemsPerEntry; i += L::kThreads) {
      const int e = i / kDequantItemsPerEntry, part = i % kDequantItemsPerEntry;
      const uint8_t* src_row = smem + L::raw + e * kl::kEntryDataBytes;
      uint8_t* dst_row = smem + L::kv + e * kRowBytes;
      if (part < kl::kNopeDim / 8) {
        const uint2 v = *reinterpret_cast<const uint2*>(src_row + part * 8);
        const float s = e8m0_to_float(smem[L::raw_scales + e * 8 + part / 8]);
        *reinterpret_cast<uint4*>(dst_row + part * 16) =
            make_uint4(e4m3x2_to_bf16x2(v.x, s), e4m3x2_to_bf16x2(v.x >> 16, s), e4m3x2_to_bf16x2(v.y, s),
                       e4m3x2_to_bf16x2(v.y >> 16, s));
      } else {
        const int chunk = part - kl::kNopeDim / 8;
        *reinterpret_cast<uint4*>(dst_row + kl::kNopeDim * 2 + chunk * 16) =
            *reinterpret_cast<const uint4*>(src_row + kl::kNopeDim + chunk * 16);
      }
    }
    if (tid < kBlock) ids[(parity ^ 1) * kBlock + tid] = next_id;
    __syncthreads();
    if (block + 1 < block_end) issue_block_load(block + 1, parity ^ 1);

    // S = Q · Kᵀ: 16 heads × 32 entries (this warp's half of the block), k = 512.
    float s[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
    const int mi = lane >> 3;
    const uint32_t q_addr = s_q + (16 * r + (lane & 15)) * kRowBytes + (lane >> 4) * 16;
    const uint32_t k_addr = s_kv + (32 * c + (mi >> 1) * 8 + (lane & 7)) * kRowBytes + (mi & 1) * 16;
#pragma unroll 8
    for (int ks = 0; ks < kD / 16; ++ks) {
      uint32_t qa[4], kb[4];
      ldsm_x4(qa, q_addr + ks * 32);
      ldsm_x4(kb, k_addr + ks * 32);
      mma_bf16(s[0], qa, kb[0], kb[1]);
      mma_bf16(s[1], qa, kb[2], kb[3]);
      ldsm_x4(kb, k_addr + 16 * kRowBytes + ks * 32);
      mma_bf16(s[2], qa, kb[0], kb[1]);
      mma_bf16(s[3], qa, kb[2], kb[3]);
    }
    // Scale, mask, row maxima over the whole 64-entry block (both halves).
    const int32_t* ok = ids + parity * kBlock;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool v = ok[32 * c + nt * 8 + 2 * tig + e] >= 0;
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
    pair_barrier(r);
    float alpha[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(m[h], fmaxf(mx[h], row_max[(1 - c) * kHeads + 16 * r + gid + 8 * h]));
      m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // nothing valid yet: keep the state empty
      alpha[h] = __expf(m[h] - m_use[h]);
      m[h] = m_new;
    }
    // p in f32 (sum in f32), rounded to bf16 for P·V (SPEC §3.11.6).
    float psum[2] = {0.f, 0.f};
    uint8_t* p_row = smem + L::p + (16 * r + gid) * kPRowBytes + (32 * c + 2 * tig) * 2;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const float p0 = __expf(s[nt][0] - m_use[0]), p1 = __expf(s[nt][1] - m_use[0]);
      const float p2 = __expf(s[nt][2] - m_use[1]), p3 = __expf(s[nt][3] - m_use[1]);
      psum[0] += p0 + p1;
      psum[1] += p2 + p3;
      *reinterpret_cast<uint32_t*>(p_row + nt * 16) = pack_bf16(p0, p1);
      *reinterpret_cast<uint32_t*>(p_row + 8 * kPRowBytes + nt * 16) = pack_bf16(p2, p3);
    }
    l[0] = l[0] * alpha[0] + psum[0];
    l[1] = l[1] * alpha[1] + psum[1];
#pragma unroll
    for (int nt = 0; nt < 32; ++nt) {
      o[nt][0] *= alpha[0];
      o[nt][1] *= alpha[0];
      o[nt][2] *= alpha[1];
      o[nt][3] *= alpha[1];
    }
    pair_barrier(r);
    // O[16 heads, 256 dims of half c] += P[16 × 64] · V[64 × 256].
    const uint32_t p_addr = s_p + (16 * r + (lane & 15)) * kPRowBytes + (lane >> 4) * 16;
    const uint32_t v_addr = s_kv + ((mi & 1) * 8 + (lane & 7)) * kRowBytes + (256 * c + (mi >> 1) * 8) * 2;
#pragma unroll
    for (int ks = 0; ks < kBlock / 16; ++ks) {
      uint32_t pa[4];
      ldsm_x4(pa, p_addr + ks * 32);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        uint32_t vb[4];
        ldsm_x4_trans(vb, v_addr + ks * 16 * kRowBytes + j * 32);
        mma_bf16(o[2 * j], pa, vb[0], vb[1]);
        mma_bf16(o[2 * j + 1], pa, vb[2], vb[3]);
      }
    }
  }

  // Row sums: the quad, then the partner warp (the other 32 entries of every block).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if (tig == 0) row_sum[c * kHeads + 16 * r + gid + 8 * h] = l[h];
  }
  pair_barrier(r);
#pragma unroll
  for (int h = 0; h < 2; ++h) l[h] += row_sum[(1 - c) * kHeads + 16 * r + gid + 8 * h];

  const int dim0 = 256 * c + 2 * tig;
  if (partial_slot < 0) {
    // Whole list in this CTA: add the sink (a logit with a zero value vector) and write bf16.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = head0 + 16 * r + gid + 8 * h;
      const float mu = m[h] == -INFINITY ? 0.f : m[h];
      const float inv = 1.f / (l[h] + __expf(a.sink[head] - mu));
      __nv_bfloat16* dst = a.out + (size_t(query) * p.n_heads + head) * kD + dim0;
#pragma unroll
      for (int nt = 0; nt < 32; ++nt)
        *reinterpret_cast<uint32_t*>(dst + nt * 8) = pack_bf16(o[nt][2 * h] * inv, o[nt][2 * h + 1] * inv);
    }
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int hl = 16 * r + gid + 8 * h;
      float* dst = p.plan.partial_acc + (size_t(partial_slot) * kHeads + hl) * kD + dim0;
#pragma unroll
      for (int nt = 0; nt < 32; ++nt)
        *reinterpret_cast<float2*>(dst + nt * 8) = make_float2(o[nt][2 * h], o[nt][2 * h + 1]);
      if (c == 0 && tig == 0) p.plan.partial_ml[size_t(partial_slot) * kHeads + hl] = make_float2(m[h], l[h]);
    }
    if (p.fused_combine) {
      // The last CTA to finish a piece of this job merges all its partials (threadfence reduction).
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
        for (int i = tid; i < kHeads * (kD / 4); i += L::kThreads)
          combine_head_dims(p, kHeads, job, first, n, i / (kD / 4), i % (kD / 4));
        if (tid == 0) p.plan.job_done[job] = 0;  // ready for the next launch (graph replays)
      }
    }
  }
}

template <int kHeads>
__global__ void __launch_bounds__(Layout<kHeads>::kThreads, 1) sparse_mla_decode_kernel(const KernelParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  if (!p.split) {  // baseline: CTA = job, whole list
    const int job = blockIdx.x;
    if (job >= p.jobs) return;
    const int query = job / p.head_groups;
    const int len = p.a.list_lengths ? min(p.a.list_lengths[query], p.a.list_stride) : p.a.list_stride;
    run_piece<kHeads>(p, smem, job, 0, max(1, (len + kBlock - 1) / kBlock), -1);
    return;
  }
  const int per_cta = p.plan.meta[0], total = p.plan.meta[1];
  int unit = blockIdx.x * per_cta;
  const int unit_end = min(total, unit + per_cta);
  if (unit >= unit_end) return;
  // The job holding `unit`: last j with job_unit_start[j] ≤ unit (starts strictly increase).
  int lo = 0, hi = p.jobs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.plan.job_unit_start[mid] <= unit) lo = mid; else hi = mid - 1;
  }
  for (int job = lo; unit < unit_end; ++job) {
    const int job_start = p.plan.job_unit_start[job], job_end = p.plan.job_unit_start[job + 1];
    const int end = min(unit_end, job_end);
    const int first_piece = p.plan.job_first_piece[job];
    const int pieces = p.plan.job_first_piece[job + 1] - first_piece;
    const int slot = pieces == 1 ? -1 : first_piece + int(blockIdx.x) - job_start / per_cta;
    run_piece<kHeads>(p, smem, job, unit - job_start, end - job_start, slot);
    unit = end;
  }
}

// Merges the partials of every job cut between CTAs: o = Σ w_i acc_i / (Σ w_i l_i + exp(sink − M)),
// w_i = exp(m_i − M). 128 threads per (job, head), 4 dims each.
__global__ void sparse_mla_combine_kernel(const KernelParams p, int heads_per_cta) {
  const int items = p.jobs * heads_per_cta;
  const int per_block = blockDim.x / 128;
  for (int item = blockIdx.x * per_block + threadIdx.x / 128; item < items; item += gridDim.x * per_block) {
    const int job = item / heads_per_cta;
    const int first = p.plan.job_first_piece[job], n = p.plan.job_first_piece[job + 1] - first;
    if (n > 1) combine_head_dims(p, heads_per_cta, job, first, n, item % heads_per_cta, threadIdx.x % 128);
  }
}

template <int kHeads>
void launch_decode(const SparseMlaPlan& plan, const KernelParams& kp, cudaStream_t stream) {
  using L = Layout<kHeads>;
  const int grid = kp.split ? plan.grid_ctas() : kp.jobs;
  if (grid == 0) return;
  sparse_mla_decode_kernel<kHeads><<<grid, L::kThreads, L::bytes, stream>>>(kp);
  DSV4_CUDA_CHECK_LAUNCH();
}

template <int kHeads>
int ctas_per_sm() {
  using L = Layout<kHeads>;
  DSV4_CUDA_CHECK(cudaFuncSetAttribute(sparse_mla_decode_kernel<kHeads>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       L::bytes));
  int blocks = 0;
  DSV4_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, sparse_mla_decode_kernel<kHeads>,
                                                                L::kThreads, L::bytes));
  DSV4_CHECK(blocks > 0, "sparse MLA decode: {} bytes of shared memory per CTA do not fit this GPU", L::bytes);
  return blocks;
}

}  // namespace

// Also sets the kernel's shared-memory limit, so that capture never has to.
int sparse_mla_ctas_per_sm(int heads_per_cta) {
  switch (heads_per_cta) {
    case 16: return ctas_per_sm<16>();
    case 32: return ctas_per_sm<32>();
    default: return ctas_per_sm<64>();
  }
}

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
  switch (hpc) {
    case 16: launch_decode<16>(plan, kp, stream); break;
    case 32: launch_decode<32>(plan, kp, stream); break;
    default: launch_decode<64>(plan, kp, stream); break;
  }
  if (kp.split && !kp.fused_combine) {
    const int items = kp.jobs * hpc;
    const int grid = std::min((items + 1) / 2, 4 * plan.grid_ctas());
    sparse_mla_combine_kernel<<<grid, 256, 0, stream>>>(kp, hpc);
    DSV4_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace dsv4::cuda
