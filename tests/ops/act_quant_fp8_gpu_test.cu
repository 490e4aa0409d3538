// FP8 activation quantisation on the GPU (backend/cuda/act_quant_fp8.h) against the CPU codec
// cpu::quantize_fp8_block, byte for byte: codes and scales, outputs poisoned first.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/act_quant_fp8.h"
#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/row_ops.h"
#include "core/dtypes.h"
#include "gpu_test_rng.h"

namespace dsv4::cuda {
namespace {

std::mt19937& rng() { return test::fresh_rng("act_quant_fp8_gpu_test"); }

// bf16 rows whose 128-channel blocks have magnitudes from 2^-30 (under the 1e-4 amax floor) to 2^14,
// some blocks all zero, some with one outlier.
std::vector<uint16_t> random_rows(int rows, int cols) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> e(-30, 14);
  std::vector<uint16_t> v(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < cols / 128; ++b) {
      const float mag = (r + b) % 11 == 0 ? 0.f : std::ldexp(1.0f, e(rng()));
      for (int i = 0; i < 128; ++i) v[size_t(r) * cols + b * 128 + i] = dsv4::f32_to_bf16(nd(rng()) * mag);
      if ((r + b) % 7 == 3) v[size_t(r) * cols + b * 128 + (r % 128)] = dsv4::f32_to_bf16(mag * 3000.f);
    }
  return v;
}

void check(int rows, int cols) {
  std::vector<uint16_t> x = random_rows(rows, cols);
  std::vector<uint8_t> want_q(x.size());
  std::vector<float> want_s(x.size() / 128), block(128);
  for (size_t b = 0; b < want_s.size(); ++b) {
    for (int i = 0; i < 128; ++i) block[i] = bf16_to_f32(x[b * 128 + i]);
    want_s[b] = cpu::quantize_fp8_block(block.data(), 128, &want_q[b * 128]);
  }
  Stream stream;
  DeviceBuffer<uint16_t> d_x(x.size());
  DeviceBuffer<uint8_t> d_q(x.size());
  DeviceBuffer<float> d_s(want_s.size());
  d_x.upload(x, stream.get());
  d_q.fill_bytes(0x7f, stream.get());  // e4m3 NaN
  d_s.fill_bytes(0xff, stream.get());  // f32 NaN
  act_quant_fp8(d_x.get(), rows, cols, d_q.get(), d_s.get(), stream.get());
  DSV4_CUDA_CHECK_LAUNCH();
  std::vector<uint8_t> q = d_q.download(stream.get());
  std::vector<float> s = d_s.download(stream.get());
  size_t bad_q = 0, bad_s = 0;
  for (size_t i = 0; i < q.size(); ++i) bad_q += q[i] != want_q[i];
  for (size_t i = 0; i < s.size(); ++i) bad_s += std::memcmp(&s[i], &want_s[i], 4) != 0;
  std::printf("act_quant_fp8 %d × %d: %zu code and %zu scale differences\n", rows, cols, bad_q, bad_s);
  EXPECT_EQ(bad_q, 0u);
  EXPECT_EQ(bad_s, 0u);
}

// With values: the codes and scales as above, and each value bf16(code · scale), exact.
void check_values(int rows, int cols) {
  std::vector<uint16_t> x = random_rows(rows, cols);
  std::vector<uint8_t> want_q(x.size());
  std::vector<float> want_s(x.size() / 128), block(128);
  std::vector<uint16_t> want_v(x.size());
  for (size_t b = 0; b < want_s.size(); ++b) {
    for (int i = 0; i < 128; ++i) block[i] = bf16_to_f32(x[b * 128 + i]);
    want_s[b] = cpu::quantize_fp8_block(block.data(), 128, &want_q[b * 128]);
    for (int i = 0; i < 128; ++i) want_v[b * 128 + i] = dsv4::f32_to_bf16(e4m3_to_f32(want_q[b * 128 + i]) * want_s[b]);
  }
  Stream stream;
  DeviceBuffer<uint16_t> d_x(x.size()), d_v(x.size());
  DeviceBuffer<uint8_t> d_q(x.size());
  DeviceBuffer<float> d_s(want_s.size());
  d_x.upload(x, stream.get());
  d_q.fill_bytes(0x7f, stream.get());
  d_s.fill_bytes(0xff, stream.get());
  d_v.fill_bytes(0xff, stream.get());
  act_quant_fp8(d_x.get(), rows, cols, d_q.get(), d_s.get(), d_v.get(), stream.get());
  DSV4_CUDA_CHECK_LAUNCH();
  const std::vector<uint8_t> q = d_q.download(stream.get());
  const std::vector<float> s = d_s.download(stream.get());
  const std::vector<uint16_t> v = d_v.download(stream.get());
  size_t bad_q = 0, bad_s = 0, bad_v = 0;
  for (size_t i = 0; i < q.size(); ++i) bad_q += q[i] != want_q[i], bad_v += v[i] != want_v[i];
  for (size_t i = 0; i < s.size(); ++i) bad_s += std::memcmp(&s[i], &want_s[i], 4) != 0;
  std::printf("act_quant_fp8 with values %d × %d: %zu code, %zu scale and %zu value differences\n", rows, cols, bad_q,
              bad_s, bad_v);
  EXPECT_EQ(bad_q, 0u);
  EXPECT_EQ(bad_s, 0u);
  EXPECT_EQ(bad_v, 0u);
}

// swiglu_act_quant_fp8 against swiglu (row_ops.h) then act_quant_fp8 on the GPU: the same codes and
// scales.
void check_swiglu(int rows, int cols, float limit) {
  const std::vector<uint16_t> g = random_rows(rows, cols), u = random_rows(rows, cols);
  Stream stream;
  DeviceBuffer<uint16_t> d_g(g.size()), d_u(u.size()), d_h(g.size());
  DeviceBuffer<uint8_t> d_q(g.size()), d_q2(g.size());
  DeviceBuffer<float> d_s(g.size() / 128), d_s2(g.size() / 128);
  d_g.upload(g, stream.get());
  d_u.upload(u, stream.get());
  for (auto* b : {&d_q, &d_q2}) b->fill_bytes(0x7f, stream.get());
  for (auto* b : {&d_s, &d_s2}) b->fill_bytes(0xff, stream.get());
  swiglu(d_g.get(), d_u.get(), rows, cols, limit, nullptr, d_h.get(), stream.get());
  act_quant_fp8(d_h.get(), rows, cols, d_q.get(), d_s.get(), stream.get());
  swiglu_act_quant_fp8(d_g.get(), d_u.get(), rows, cols, limit, d_q2.get(), d_s2.get(), stream.get());
  DSV4_CUDA_CHECK_LAUNCH();
  const std::vector<uint8_t> q = d_q.download(stream.get()), q2 = d_q2.download(stream.get());
  const std::vector<float> s = d_s.download(stream.get()), s2 = d_s2.download(stream.get());
  size_t bad_q = 0, bad_s = 0;
  for (size_t i = 0; i < q.size(); ++i) bad_q += q[i] != q2[i];
  for (size_t i = 0; i < s.size(); ++i) bad_s += std::memcmp(&s[i], &s2[i], 4) != 0;
  std::printf("swiglu_act_quant_fp8 %d × %d (limit %g): %zu code and %zu scale differences\n", rows, cols, limit, bad_q,
              bad_s);
  EXPECT_EQ(bad_q, 0u);
  EXPECT_EQ(bad_s, 0u);
}

TEST(ActQuantFp8, ValuesAreCodeTimesScale) {
  check_values(1, 4096);
  check_values(37, 2048);
}

TEST(ActQuantFp8, SwigluInputIsSwigluThenQuantise) {
  for (float limit : {0.f, 10.f}) {
    check_swiglu(1, 2048, limit);
    check_swiglu(19, 256, limit);
  }
}

TEST(ActQuantFp8, MatchesCpuCodec) {
  check(1, 128);
  check(3, 4096);
  check(257, 2048);
}

TEST(ActQuantFp8Sanitizer, Small) {
  check(5, 384);
  check_values(3, 256);
  check_swiglu(2, 256, 10.f);
}

}  // namespace
}  // namespace dsv4::cuda
