// Device twins of the reference's FP8 quantisation arithmetic (SPEC.md §2.2), shared by the kernels
// that quantise on the GPU (KV cache appends, activation quantisation).
#pragma once
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

// e4m3 of clamp(v, ±448), round to nearest even.
__device__ __forceinline__ uint8_t to_e4m3(float v) {
  v = fminf(fmaxf(v, -448.f), 448.f);
  return uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

}  // namespace dsv4::cuda
