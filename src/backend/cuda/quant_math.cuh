// Device twins of the reference's rounding arithmetic (bf16, SPEC.md §2.2 FP8), and the warp
// reductions, shared by the kernels that round or quantise on the GPU.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace dsv4::cuda {

// 2^ceil(log2(v)) for v > 0 from the IEEE bits (SPEC §2.2), as core/dtypes.h pow2_ceil.
__device__ __forceinline__ float pow2_ceil_dev(float v) {
  const uint32_t u = __float_as_uint(v);
  int e = int((u >> 23) & 0xff) - 127;
  if (u & 0x7fffffu) e += 1;
  // 2^e for e in [-149, 127]: build from bits (subnormal below -126).
  if (e >= -126) return __uint_as_float(uint32_t(e + 127) << 23);
  return __uint_as_float(1u << (e + 149));
}

// bf16 bits → f32, and f32 → bf16 bits as core/dtypes.h f32_to_bf16 (round to nearest even, NaN
// stays a quiet NaN): the rounding point of every bf16 output the reference produces.
__device__ __forceinline__ float bf16_value(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }
__device__ __forceinline__ uint16_t bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// ue8m0 byte → 2^(byte − 127) as core/dtypes.h e8m0_to_f32 (0 → the subnormal 2^-127, 255 → NaN).
__device__ __forceinline__ float e8m0_to_f32_dev(uint8_t e) {
  if (e == 255) return __uint_as_float(0x7fc00000u);
  if (e == 0) return __uint_as_float(0x00400000u);
  return __uint_as_float(uint32_t(e) << 23);
}

// Butterfly reductions over a full warp; every lane gets the result.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// rms_norm's steps on a chunk of 8 bf16 channels (a uint4), for every kernel that applies it: the
// squares added to ss in channel order; 1 / sqrt(mean + eps) as the CPU (its double sum divided by n
// in double, rounded to f32); the scaled, weighted chunk bf16(w · (x · rs)).
__device__ __forceinline__ float add_squares8(const uint4& x, float ss) {
  const uint32_t words[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float lo = __uint_as_float(words[k] << 16), hi = __uint_as_float(words[k] & 0xffff0000u);
    ss = fmaf(hi, hi, fmaf(lo, lo, ss));
  }
  return ss;
}
__device__ __forceinline__ float rms_inverse(float sum_sq, int n, float eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(float(double(sum_sq) / double(n)), eps)));
}
__device__ __forceinline__ uint4 rms_scale8(const uint4& x, const uint4& w, float rs) {
  const uint32_t xw[4] = {x.x, x.y, x.z, x.w}, ww[4] = {w.x, w.y, w.z, w.w};
  uint32_t out[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float lo = __fmul_rn(__uint_as_float(ww[k] << 16), __fmul_rn(__uint_as_float(xw[k] << 16), rs));
    const float hi = __fmul_rn(__uint_as_float(ww[k] & 0xffff0000u), __fmul_rn(__uint_as_float(xw[k] & 0xffff0000u), rs));
    out[k] = uint32_t(bf16_bits(lo)) | uint32_t(bf16_bits(hi)) << 16;
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// Sum over the block (blockDim.x a multiple of 32), once per kernel; every thread gets the same value
// because every thread adds the per-warp sums in the same order.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < int(blockDim.x / 32); ++w) total += warp_sums[w];
  return total;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The clamped SwiGLU of one element before its bf16 rounding (SPEC §3.7, cpu_moe.cpp run_expert): if
// limit > 0, up is clamped to ±limit and gate to ≤ limit; silu(gate)·up. expf is within 2 ulp of the
// CPU's std::exp: the bf16 output then differs only on rare ties.
__device__ __forceinline__ float swiglu_value(float g, float u, float limit) {
  if (limit > 0) {
    u = fminf(fmaxf(u, -limit), limit);
    g = fminf(g, limit);
  }
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// e4m3 of clamp(v, ±448), round to nearest even.
__device__ __forceinline__ uint8_t to_e4m3(float v) {
  v = fminf(fmaxf(v, -448.f), 448.f);
  return uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// SPEC §2.2's activation scale of a 128-channel block (cpu::quantize_fp8_block): a power of two,
// 2^ceil(log2(max(amax, 1e-4) / 448)).
__device__ __forceinline__ float act_fp8_scale(float amax) { return pow2_ceil_dev(fmaxf(amax, 1e-4f) * (1.0f / 448.0f)); }

// An e4m3 code times its block's scale as bf16: exact (a code times a power of two).
__device__ __forceinline__ uint16_t act_fp8_value(uint32_t code, float s) {
  const float c = __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(code & 0xffu), __NV_E4M3)));
  return bf16_bits(__fmul_rn(c, s));
}

// act_quant_fp8 of one 128-channel block held as 8 consecutive bf16 values (x) by each of 16
// consecutive lanes: the lane's 8 codes into q, the block's scale into *scale (by the half warp's
// first lane), with values (not null) the 8 quantised values as bf16. Called by all 32 lanes of a
// warp, each half its own block; the bits of act_quant_fp8 (a maximum does not depend on its order).
__device__ __forceinline__ void act_quant_half_warp8(const uint4& x, uint8_t* q, float* scale, uint16_t* values) {
  const uint32_t w[4] = {x.x, x.y, x.z, x.w};
  float v[8];
#pragma unroll
  for (int k = 0; k < 4; ++k) v[2 * k] = __uint_as_float(w[k] << 16), v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int o = 8; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = act_fp8_scale(amax);
  // x / s as x · (1/s): s is a power of two within 2^±126, so 1/s is exact and both round the same
  // exact quotient once (a division is ~10 instructions; this block is on the decode chain).
  const float inv_s = 1.0f / s;
  uint32_t codes[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 8; ++i) codes[i / 4] |= uint32_t(to_e4m3(__fmul_rn(v[i], inv_s))) << (8 * (i % 4));
  *reinterpret_cast<uint2*>(q) = make_uint2(codes[0], codes[1]);
  if (threadIdx.x % 16 == 0) *scale = s;
  if (values) {
    uint32_t h[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      h[k] = uint32_t(act_fp8_value(codes[k / 2] >> (16 * (k % 2)), s)) |
             uint32_t(act_fp8_value(codes[k / 2] >> (16 * (k % 2) + 8), s)) << 16;
    *reinterpret_cast<uint4*>(values) = make_uint4(h[0], h[1], h[2], h[3]);
  }
}

}  // namespace dsv4::cuda
