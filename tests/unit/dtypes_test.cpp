// Number formats (SPEC §5.2), exhaustively over every code.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtypes.h"

namespace dsv4 {
namespace {

TEST(E4m3, DecodesEveryCode) {
  for (int c = 0; c < 256; ++c) {
    float v = e4m3_to_f32(uint8_t(c));
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    double want = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1 + m / 8.0, e - 7);
    EXPECT_EQ(v, float(s ? -want : want)) << c;
  }
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
}

TEST(E4m3, EncodeRoundTripsAndRoundsToNearestEven) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    float v = e4m3_to_f32(uint8_t(c));
    if (v == 0) continue;  // ±0 keep their sign
    EXPECT_EQ(f32_to_e4m3(v), c) << c;
  }
  // Midpoints between neighbours round to the even code; just off the midpoint rounds to nearest.
  for (int c = 0; c < 126; ++c) {
    float a = e4m3_to_f32(uint8_t(c)), b = e4m3_to_f32(uint8_t(c + 1));
    float mid = (a + b) / 2;
    EXPECT_EQ(f32_to_e4m3(mid), (c % 2 == 0) ? c : c + 1) << c;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, a)), c) << c;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, b)), c + 1) << c;
    EXPECT_EQ(f32_to_e4m3(-mid), 0x80 | ((c % 2 == 0) ? c : c + 1)) << c;
  }
  EXPECT_EQ(f32_to_e4m3(0.0f), 0);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(std::nanf("")), 0x7f);
}

TEST(E2m1, EveryCode) {
  const float mags[8] = {0, .5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    float v = e2m1_to_f32(uint8_t(c));
    EXPECT_EQ(v, (c & 8) ? -mags[c & 7] : mags[c & 7]) << c;
    if (c != 8) {
      EXPECT_EQ(f32_to_e2m1(v), c) << c;
    }
  }
  for (int c = 0; c < 7; ++c) {
    float mid = (mags[c] + mags[c + 1]) / 2;
    EXPECT_EQ(f32_to_e2m1(mid), (c % 2 == 0) ? c : c + 1) << "midpoint after " << mags[c];
    EXPECT_EQ(f32_to_e2m1(std::nextafter(mid, 0.0f)), c);
    EXPECT_EQ(f32_to_e2m1(std::nextafter(mid, 10.0f)), c + 1);
  }
  EXPECT_EQ(f32_to_e2m1(100.0f), 7);  // saturates
  EXPECT_EQ(f32_to_e2m1(-100.0f), 15);
}

TEST(E8m0, EveryCode) {
  for (int e = 0; e < 255; ++e) {
    float v = e8m0_to_f32(uint8_t(e));
    EXPECT_EQ(v, std::ldexp(1.0f, e - 127)) << e;
    EXPECT_EQ(f32_pow2_to_e8m0(v), e) << e;
  }
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
}

TEST(Bf16, EveryCodeRoundTripsAndRneOnHalfway) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = bf16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_bf16(f), h) << h;
    // The f32 halfway between h and h+1 rounds to the even one.
    if ((h & 0x7f80) != 0x7f80 && h != 0x7fff && h != 0xffff) {
      uint32_t mid = (h << 16) | 0x8000;
      uint16_t want = (h & 1) ? uint16_t(h + 1) : uint16_t(h);
      EXPECT_EQ(f32_to_bf16(bits_to_f32(mid)), want) << h;
      EXPECT_EQ(f32_to_bf16(bits_to_f32(mid + 1)), uint16_t(h + 1)) << h;
      EXPECT_EQ(f32_to_bf16(bits_to_f32(mid - 1)), uint16_t(h)) << h;
    }
  }
}

TEST(Pow2Ceil, MatchesLog2Definition) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-30, 30);
  for (int i = 0; i < 100000; ++i) {
    float v = std::exp2(u(rng));
    EXPECT_EQ(pow2_ceil(v), std::exp2(std::ceil(std::log2(double(v))))) << v;
  }
  EXPECT_EQ(pow2_ceil(1.0f), 1.0f);
  EXPECT_EQ(pow2_ceil(0.75f), 1.0f);
  EXPECT_EQ(pow2_ceil(448.0f / 448.0f), 1.0f);
}

}  // namespace
}  // namespace dsv4
