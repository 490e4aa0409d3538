#include "core/dtypes.h"

#include <array>

namespace dsv4 {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::BF16: case DType::F16: case DType::I16: return 2;
    case DType::F32: case DType::I32: return 4;
    case DType::F64: case DType::I64: return 8;
    case DType::F8_E4M3: case DType::F8_E8M0: case DType::I8: case DType::U8: case DType::BOOL: return 1;
  }
  return 0;
}

namespace {
constexpr std::array<std::pair<DType, std::string_view>, 12> kNames{{
    {DType::BF16, "BF16"}, {DType::F32, "F32"}, {DType::F8_E4M3, "F8_E4M3"},
    {DType::F8_E8M0, "F8_E8M0"}, {DType::I8, "I8"}, {DType::U8, "U8"}, {DType::I32, "I32"},
    {DType::I64, "I64"}, {DType::F16, "F16"}, {DType::F64, "F64"}, {DType::BOOL, "BOOL"},
    {DType::I16, "I16"}}};
}  // namespace

std::string_view dtype_name(DType t) {
  for (auto& [d, n] : kNames) if (d == t) return n;
  return "?";
}

bool dtype_from_name(std::string_view name, DType* out) {
  for (auto& [d, n] : kNames) if (n == name) { *out = d; return true; }
  return false;
}

float e4m3_to_f32(uint8_t code) {
  int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::nanf("");
  float v = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(float(8 + m), e - 10);
  return s ? -v : v;
}

namespace {
// Nearest-even rounding onto a sorted table of non-negative magnitudes (codes 0..n-1).
template <size_t N>
int round_to_table(float a, const std::array<float, N>& mags) {
  if (a >= mags[N - 1]) return int(N - 1);
  size_t lo = 0, hi = N - 1;  // mags[lo] <= a < mags[hi]
  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    if (mags[mid] <= a) lo = mid; else hi = mid;
  }
  float dl = a - mags[lo], dh = mags[hi] - a;
  if (dl < dh) return int(lo);
  if (dh < dl) return int(hi);
  return (lo & 1) ? int(hi) : int(lo);  // tie: even code (even mantissa)
}

std::array<float, 127> make_e4m3_mags() {
  std::array<float, 127> t{};
  for (int c = 0; c < 127; ++c) t[c] = e4m3_to_f32(uint8_t(c));
  return t;
}
}  // namespace

uint8_t f32_to_e4m3(float x) {
  static const std::array<float, 127> mags = make_e4m3_mags();  // codes 0..126, 126 = 448
  if (std::isnan(x)) return 0x7f;
  uint8_t s = std::signbit(x) ? 0x80 : 0;
  return uint8_t(s | round_to_table(std::fabs(x), mags));
}

uint8_t f32_to_e2m1(float x) {
  static constexpr std::array<float, 8> mags{0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  if (std::isnan(x)) return 0;
  uint8_t s = std::signbit(x) ? 8 : 0;
  return uint8_t(s | round_to_table(std::fabs(x), mags));
}

}  // namespace dsv4
