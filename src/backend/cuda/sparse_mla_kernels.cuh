// What the two sparse-MLA decode kernels share (sparse_mla_decode.cu: mma.sync, every GPU;
// sparse_mla_decode_wgmma.cu: wgmma, sm_90a): their parameters and the walk over a CTA's pieces.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/sparse_mla_decode.h"

namespace dsv4::cuda::sparse_mla_detail {

struct KernelParams {
  SparseMlaArgs a;
  SparseMlaPlan::View plan;
  int n_heads;
  int head_groups;
  int jobs;
  bool split;
  bool fused_combine;
  // reference_rounding (mma.sync): the first launch walks the pieces for their score maxima only
  // (max_pass); the second starts each piece from the maximum of the pieces before it.
  bool reference_rounding = false;
  bool max_pass = false;
};

// Threads of the separate combine kernel's CTAs (8 warps).
constexpr int kCombineThreads = 256;

// ---- FP8 cache entries → bf16 (exact: e4m3 · 2^k fits bf16) ------------------------------------
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
// Scale codes the fast conversion takes: 2^(code − 127 + 112) must be a normal bf16.
__device__ __forceinline__ bool fast_scale_code(uint32_t code) { return code >= 1 && code <= 142; }
// Fast form, 5 instructions per pair: the hardware e4m3x2 → f16x2 conversion, then f16 → bf16 by
// moving the exponent field ((h & 0x7fff) >> 3 is the bf16 pattern of h · 2^-112, exact because an
// e4m3 value is a normal f16 whose low 7 mantissa bits are zero; the other half's bits that the
// shift brings in are those zero bits), then one bf16x2 multiply by folded = 2^(code − 15) in both
// halves, also exact.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2_fast(uint32_t two, uint32_t folded) {
  const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two & 0xffffu), __NV_E4M3);
  const uint32_t h = uint32_t(hr.x) | (uint32_t(hr.y) << 16);
  const uint32_t bits = ((h >> 3) & 0x0fff0fffu) | (h & 0x80008000u);
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&bits),
                             *reinterpret_cast<const __nv_bfloat162*>(&folded));
  return *reinterpret_cast<const uint32_t*>(&r);
}
// 16 e4m3 of one 64-dim scale group → 16 bf16 (lo: the first 8), pair by pair through `pair`
// (two e4m3 in the low 16 bits → bf16x2). The fast form needs fast_scale_code(code); the f32 form
// takes any code.
template <typename Pair>
__device__ __forceinline__ void dequant16_pairs(const uint4& v, uint4& lo, uint4& hi, Pair pair) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = pair(w[i]);
    o[2 * i + 1] = pair(w[i] >> 16);
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}
__device__ __forceinline__ void dequant16_fast(const uint4& v, uint32_t code, uint4& lo, uint4& hi) {
  const uint32_t folded = ((code + 112u) << 7) * 0x10001u;
  dequant16_pairs(v, lo, hi, [folded](uint32_t two) { return e4m3x2_to_bf16x2_fast(two, folded); });
}
__device__ __forceinline__ void dequant16_f32(const uint4& v, uint32_t code, uint4& lo, uint4& hi) {
  const float sc = e8m0_to_float(uint8_t(code));
  dequant16_pairs(v, lo, hi, [sc](uint32_t two) { return e4m3x2_to_bf16x2(two, sc); });
}
__device__ __forceinline__ void dequant16(const uint4& v, uint32_t code, uint4& lo, uint4& hi) {
  if (fast_scale_code(code))
    dequant16_fast(v, code, lo, hi);
  else  // scales above 2^15 or code 0: through f32
    dequant16_f32(v, code, lo, hi);
}

// A CTA's first piece (job, first and end block in the job, partial slot; job −1: no work) and the
// plan's unit counts: a split CTA's first loads.
struct PieceStart {
  int4 first;
  int per_cta, total;
};
__device__ __forceinline__ PieceStart load_piece_start(const KernelParams& p) {
  // All three at once: they are independent, and a CTA's start is a chain of latencies.
  return PieceStart{p.plan.cta_first_piece[blockIdx.x], p.plan.meta[0], p.plan.meta[1]};
}

// Calls piece(job, first block, end block, partial slot (−1: whole job), last) for each piece of this
// CTA's unit range in the plan, in order. The first piece comes from `start`; later pieces (a range
// that spans jobs) from the job tables.
template <typename F>
__device__ __forceinline__ void for_each_piece(const KernelParams& p, const PieceStart& start, F&& piece) {
  const int4 first = start.first;
  const int per_cta = start.per_cta, total = start.total;
  if (first.x < 0) return;
  const int unit_end = min(total, int(blockIdx.x + 1) * per_cta);
  int job = first.x, begin = first.y, end = first.z, slot = first.w;
  for (int unit = blockIdx.x * per_cta;;) {
    unit += end - begin;
    const bool last = unit >= unit_end;
    piece(job, begin, end, slot, last);
    if (last) break;
    ++job;  // starts at `unit`
    const int job_start = p.plan.job_unit_start[job], job_units = p.plan.job_unit_start[job + 1] - job_start;
    const int first_piece = p.plan.job_first_piece[job];
    const int pieces = p.plan.job_first_piece[job + 1] - first_piece;
    begin = 0;
    end = min(unit_end - unit, job_units);
    slot = pieces == 1 ? -1 : first_piece + int(blockIdx.x) - job_start / per_cta;
  }
}
template <typename F>
__device__ __forceinline__ void for_each_piece(const KernelParams& p, F&& piece) {
  for_each_piece(p, load_piece_start(p), piece);
}

// The wgmma kernel (sm_90a; 64 heads × 64-entry blocks per CTA, one CTA per SM).
bool sparse_mla_wgmma_supported();  // an sm_90 GPU running the sm_90a binary
void sparse_mla_wgmma_launch(int grid, const KernelParams& kp, cudaStream_t stream);

}  // namespace dsv4::cuda::sparse_mla_detail
