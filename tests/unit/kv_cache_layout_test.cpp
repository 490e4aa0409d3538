// The paged cache layout (SPEC §4.2) and its host codecs: offsets, and lossless round trips with
// respect to the reference's FP8 (§2.5) and FP4 (§2.6) simulations.
#include "backend/kv_cache_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace dsv4::kv_layout {
namespace {

// SPEC §2.5 written out independently of the codec: y = bf( f32(e4m3(clamp(x/s, ±448))) · s ).
std::vector<float> fp8_simulate_reference(const std::vector<float>& x) {
  std::vector<float> y(x);
  for (int b = 0; b < kNumScales; ++b) {
    float amax = 0;
    for (int i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(x[b * 64 + i]));
    amax = std::max(amax, 1e-4f);
    float s = pow2_ceil(amax * (1.0f / 448.0f));
    for (int i = 0; i < 64; ++i) {
      float v = std::clamp(x[b * 64 + i] / s, -448.f, 448.f);
      y[b * 64 + i] = round_bf16(e4m3_to_f32(f32_to_e4m3(v)) * s);
    }
  }
  return y;
}

// SPEC §2.6: y = bf( f32(e2m1(clamp(x/s, ±6))) · s ), s = 2^ceil(log2(max(amax, 6·2^-126)/6)).
std::vector<float> fp4_simulate_reference(const std::vector<float>& x) {
  std::vector<float> y(x);
  for (int b = 0; b < kIndexFp4Scales; ++b) {
    float amax = 6.0f * std::ldexp(1.0f, -126);
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    float s = pow2_ceil(amax / 6.0f);
    for (int i = 0; i < 32; ++i)
      y[b * 32 + i] = round_bf16(e2m1_to_f32(f32_to_e2m1(std::clamp(x[b * 32 + i] / s, -6.f, 6.f))) * s);
  }
  return y;
}

TEST(KvCacheLayout, PageGeometry) {
  EXPECT_EQ(kEntryBytes, 584);
  EXPECT_EQ(kKvPageBytes % 576, 0u);
  EXPECT_GE(kKvPageBytes, size_t(584) * kEntriesPerPage);
  EXPECT_EQ(kv_entry_data_offset(0), 0u);
  EXPECT_EQ(kv_entry_data_offset(3), 3u * 576);
  EXPECT_EQ(kv_entry_scale_offset(3), 576u * kEntriesPerPage + 24);
  EXPECT_EQ(kv_entry_data_offset(kEntriesPerPage + 1), kKvPageBytes + 576);
  EXPECT_EQ(kv_entry_scale_offset(2 * kEntriesPerPage), 2 * kKvPageBytes + 576u * kEntriesPerPage);
  EXPECT_EQ(index_fp4_scale_offset(kEntriesPerPage + 2), kIndexFp4PageBytes + 64u * kEntriesPerPage + 8);
  // Entries and scales of one page never overlap the next page.
  EXPECT_LE(kv_entry_scale_offset(kEntriesPerPage - 1) + 8, kKvPageBytes);
  EXPECT_LE(index_fp4_scale_offset(kEntriesPerPage - 1) + 4, kIndexFp4PageBytes);
  EXPECT_LE(index_fp8_scale_offset(kEntriesPerPage - 1) + 4, kIndexFp8PageBytes);
}

// Random bf16 vectors over many magnitudes (including all-tiny blocks under the 1e-4 floor and
// zeros): decode(encode(x)) is the FP8 simulation, and encoding the simulated values is idempotent.
TEST(KvCacheLayout, KvEntryMatchesFp8Simulation) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> exp_pick(-30, 12);
  std::vector<uint8_t> pool(3 * kKvPageBytes, 0xcd);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<float> x(kHeadDim);
    for (int b = 0; b < 8; ++b) {
      float mag = std::ldexp(1.0f, exp_pick(rng));
      for (int i = 0; i < 64; ++i) x[b * 64 + i] = round_bf16(nd(rng) * mag);
    }
    if (trial % 7 == 0) for (int i = 64; i < 128; ++i) x[i] = 0.f;
    if (trial % 11 == 0) for (int i = 0; i < 64; ++i) x[i] = round_bf16(x[i] * 1e-6f);
    std::vector<float> want = fp8_simulate_reference(x);
    const int64_t g = trial % (3 * kEntriesPerPage);
    encode_kv_entry_at(pool.data(), g, x.data());
    std::vector<float> got(kHeadDim);
    decode_kv_entry_at(pool.data(), g, got.data());
    for (int i = 0; i < kHeadDim; ++i) ASSERT_EQ(f32_to_bits(got[i]), f32_to_bits(want[i])) << "trial " << trial << " i " << i;
    // Idempotent: encoding the simulated vector decodes to itself.
    encode_kv_entry_at(pool.data(), g, want.data());
    decode_kv_entry_at(pool.data(), g, got.data());
    for (int i = 0; i < kHeadDim; ++i) ASSERT_EQ(f32_to_bits(got[i]), f32_to_bits(want[i])) << "re-encode trial " << trial;
    // bf16 input form agrees with the float form.
    std::vector<uint16_t> xb(kHeadDim), outb(kHeadDim);
    for (int i = 0; i < kHeadDim; ++i) xb[i] = f32_to_bf16(x[i]);
    uint8_t data[576], scales[8];
    encode_kv_entry(xb.data(), data, scales);
    decode_kv_entry(data, scales, outb.data());
    for (int i = 0; i < kHeadDim; ++i) ASSERT_EQ(outb[i], f32_to_bf16(want[i]));
  }
}

// Every e4m3 code at every scale the reference can produce for realistic KV round-trips exactly.
TEST(KvCacheLayout, EveryE4m3CodeAtManyScales) {
  uint8_t data[576], scales[8];
  for (int e = -40; e <= 20; ++e) {
    const float s = std::ldexp(1.0f, e);
    std::vector<float> x(kHeadDim, 0.f);
    int i = 0;
    for (int code = 0; code < 256; ++code) {
      if ((code & 0x7f) == 0x7f) continue;  // NaN codes
      x[i++] = e4m3_to_f32(uint8_t(code)) * s;
    }
    // Pin each block's amax to 448·s so the block scale is s, whatever codes it holds.
    for (int b = 0; b < kNumScales; ++b) x[b * 64 + 63] = 448.f * s;
    for (int k = kNopeDim; k < kHeadDim; ++k) x[k] = round_bf16(float(k - 480) * s);
    if (s * 448.f < 1e-4f) continue;  // below the amax floor the scale is the floor's
    encode_kv_entry(x.data(), data, scales);
    std::vector<float> got(kHeadDim);
    decode_kv_entry(data, scales, got.data());
    for (int k = 0; k < kHeadDim; ++k) ASSERT_EQ(f32_to_bits(got[k]), f32_to_bits(x[k])) << "scale 2^" << e << " k " << k;
  }
}

TEST(KvCacheLayout, IndexKeyFp4MatchesFp4Simulation) {
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> exp_pick(-20, 8);
  std::vector<uint8_t> pool(2 * kIndexFp4PageBytes, 0xcd);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<float> x(kIndexDim);
    for (int b = 0; b < 4; ++b) {
      float mag = std::ldexp(1.0f, exp_pick(rng));
      for (int i = 0; i < 32; ++i) x[b * 32 + i] = round_bf16(nd(rng) * mag);
    }
    if (trial % 5 == 0) for (int i = 0; i < 32; ++i) x[i] = 0.f;
    std::vector<float> want = fp4_simulate_reference(x);
    const int64_t g = trial % (2 * kEntriesPerPage);
    std::vector<float> got(kIndexDim);
    encode_index_key_fp4_at(pool.data(), g, x.data());
    decode_index_key_fp4_at(pool.data(), g, got.data());
    for (int i = 0; i < kIndexDim; ++i) ASSERT_EQ(f32_to_bits(got[i]), f32_to_bits(want[i])) << trial;
    encode_index_key_fp4_at(pool.data(), g, want.data());
    decode_index_key_fp4_at(pool.data(), g, got.data());
    for (int i = 0; i < kIndexDim; ++i) ASSERT_EQ(f32_to_bits(got[i]), f32_to_bits(want[i])) << trial;
    // FP8 form is lossless for simulated keys whose block scales are close (all here: spread ≤ 2^8).
    uint8_t d8[128];
    float s8;
    if (trial % 3 == 0) {
      std::vector<float> close(x);
      for (int i = 0; i < kIndexDim; ++i) close[i] = round_bf16(nd(rng));
      want = fp4_simulate_reference(close);
      encode_index_key_fp8(want.data(), d8, &s8);
      decode_index_key_fp8(d8, s8, got.data());
      for (int i = 0; i < kIndexDim; ++i) ASSERT_EQ(f32_to_bits(got[i]), f32_to_bits(want[i])) << trial;
    }
  }
}

}  // namespace
}  // namespace dsv4::kv_layout
