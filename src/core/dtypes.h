// Number formats of DeepSeek-V4 checkpoints and of its simulated quantisation (SPEC §5.2).
// All codecs are exact bit-level functions shared by the CPU backend, the loader and the tests.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace dsv4 {

enum class DType : uint8_t { BF16, F32, F8_E4M3, F8_E8M0, I8, U8, I32, I64, F16, F64, BOOL, I16 };

// Bytes per element; 0 for none.
size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
// Parses a safetensors dtype string ("BF16", "F8_E4M3", ...). Returns false when unknown.
bool dtype_from_name(std::string_view name, DType* out);

inline float bits_to_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t f32_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// bf16: the top half of an f32. Encoding rounds to nearest even; NaN stays a quiet NaN.
inline float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
// Round an f32 to the nearest bf16 value, staying in f32 ("bf(x)" in SPEC.md).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// e4m3fn: bias 7, no infinities, max finite 448, S.1111.111 is NaN.
float e4m3_to_f32(uint8_t code);
// Round to nearest even; |x| beyond the largest finite value saturates to ±448 only when the
// caller clamps first (the reference always clamps to ±448 before the cast). NaN → 0x7f.
uint8_t f32_to_e4m3(float x);

// ue8m0: value 2^(e-127); 255 is NaN.
inline float e8m0_to_f32(uint8_t e) {
  if (e == 255) return std::nanf("");
  if (e == 0) return bits_to_f32(0x00400000u);  // 2^-127 is subnormal in f32
  return bits_to_f32(uint32_t(e) << 23);
}
// Encodes a positive power of two exactly (the only values the reference produces).
inline uint8_t f32_pow2_to_e8m0(float p) {
  uint32_t u = f32_to_bits(p);
  if (u == 0x00400000u) return 0;
  return uint8_t((u >> 23) & 0xff);
}

// e2m1 (FP4): code bit 3 = sign; magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}.
inline float e2m1_to_f32(uint8_t code) {
  static constexpr float kMag[8] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  float m = kMag[code & 7];
  return (code & 8) ? -m : m;
}
// Round to nearest even on the e2m1 grid, saturating at ±6. NaN → 0.
uint8_t f32_to_e2m1(float x);

// 2^ceil(log2(v)) for v > 0, computed from the IEEE bits as the reference does (SPEC §2.2):
// unbiased exponent, +1 when the mantissa is not zero.
inline float pow2_ceil(float v) {
  uint32_t u = f32_to_bits(v);
  int e = int((u >> 23) & 0xff) - 127;
  if (u & 0x7fffffu) e += 1;
  return std::ldexp(1.0f, e);
}

}  // namespace dsv4
