// Quantisation primitives of the reference (SPEC §2.2, §2.5–2.7), bit-exact.
#include <algorithm>
#include <array>
#include <cmath>

#include "backend/cpu/cpu_backend.h"

namespace dsv4::cpu {

const float* e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[size_t(i)] = e4m3_to_f32(uint8_t(i));
    return t;
  }();
  return table.data();
}

// The reference multiplies by the f32 constant 1/448 (not divides), then rounds the scale up to
// a power of two from the IEEE bits.
float fp8_block_scale(float amax) { return pow2_ceil(std::max(amax, 1e-4f) * (1.0f / 448.0f)); }
float fp4_block_scale(float amax) { return pow2_ceil(std::max(amax, 6.0f * std::ldexp(1.0f, -126)) * (1.0f / 6.0f)); }

float quantize_fp8_block(const float* x, int n, uint8_t* codes) {
  float amax = 0;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  float s = fp8_block_scale(amax);
  for (int i = 0; i < n; ++i) codes[i] = f32_to_e4m3(std::clamp(x[i] / s, -448.0f, 448.0f));
  return s;
}

void fp8_simulate_block(uint16_t* x, int n) {
  float amax = 0;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(bf16_to_f32(x[i])));
  float s = fp8_block_scale(amax);
  for (int i = 0; i < n; ++i) {
    float q = e4m3_to_f32(f32_to_e4m3(std::clamp(bf16_to_f32(x[i]) / s, -448.0f, 448.0f)));
    x[i] = f32_to_bf16(q * s);
  }
}

void fp4_simulate_block(uint16_t* x, int n) {
  float amax = 0;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(bf16_to_f32(x[i])));
  float s = fp4_block_scale(amax);
  for (int i = 0; i < n; ++i) {
    float q = e2m1_to_f32(f32_to_e2m1(std::clamp(bf16_to_f32(x[i]) / s, -6.0f, 6.0f)));
    x[i] = f32_to_bf16(q * s);
  }
}

void hadamard128(uint16_t* x) {
  float v[128];
  for (int i = 0; i < 128; ++i) v[i] = bf16_to_f32(x[i]);
  for (int h = 1; h < 128; h *= 2)
    for (int i = 0; i < 128; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
  const float scale = float(1.0 / std::sqrt(128.0));
  for (int i = 0; i < 128; ++i) x[i] = f32_to_bf16(v[i] * scale);
}

}  // namespace dsv4::cpu
