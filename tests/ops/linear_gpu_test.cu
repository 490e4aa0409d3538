// The CUDA linears (backend/cuda/linear.h) against the CpuBackend ops they replace — linear (FP8
// block weights), linear_bf16, linear_f32 (bf16 or f32 input), grouped_out_proj, logits — at the
// fixture and DeepSeek-V4-Flash shapes, on fresh random inputs, outputs poisoned first.
//
// Tolerance. Both sides compute the same terms; the CPU sums in double (exact per FP8 block) and
// rounds once, the GPU in f32 in another order. Per output, with S = Σ_k |x_k·w_k| (scales included)
// and u = 2^-24, the GPU's f32 error is at most (sequential terms per lane + tree depth)·u·S:
//   FP8:  16 per chunk + K/512 chunks per lane + 5 shuffle levels, and the CPU's own rounding of each
//         block partial and K/128 block additions: < (K/64 + 32)·u·S;
//   bf16: K/32 per lane + 5 levels, and the CPU's one rounding: < (K/32 + 8)·u·S.
// A bf16 output may then round to the neighbouring bf16 value: allowed |Δ| = bound + 1 ulp (bf16 ulp
// of the larger magnitude). Required: every element within that, ≥ 99.9% within 1 ulp (the f32
// error is far below an ulp except under cancellation), no NaN. f32 outputs: bound + 1 f32 ulp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/linear.h"
#include "core/dtypes.h"
#include "gpu_test_rng.h"

namespace dsv4::cuda {
namespace {

std::mt19937& rng() { return test::fresh_rng("linear_gpu_test"); }

constexpr double kU = 1.0 / (1 << 24);

// bf16 activations, normal with a random power-of-two magnitude per 128-channel block (so the FP8
// scales differ along K and across rows).
std::vector<uint16_t> random_bf16(int64_t rows, int cols) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> e(-4, 4);
  std::vector<uint16_t> v(size_t(rows) * size_t(cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int c0 = 0; c0 < cols; c0 += 128) {
      const float mag = std::ldexp(1.f, e(rng()));
      for (int c = c0; c < std::min(cols, c0 + 128); ++c) v[size_t(r) * cols + c] = f32_to_bf16(nd(rng()) * mag);
    }
  return v;
}

double ulp_bf16(double a, double b) {
  const double m = std::max(std::fabs(a), std::fabs(b));
  if (m == 0) return 0;
  int e;
  std::frexp(m, &e);  // m = f · 2^e, f ∈ [0.5, 1)
  return std::ldexp(1.0, e - 8);
}

struct Agreement {
  size_t total = 0, exact = 0, within_ulp = 0, beyond_bound = 0, nan = 0;
  double worst_ulps = 0;
};

// got/want as f32 values; bound = the f32-accumulation bound per element (without the output ulp).
Agreement compare(const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& bound,
                  bool bf16_out) {
  Agreement s;
  for (size_t i = 0; i < got.size(); ++i) {
    ++s.total;
    if (std::isnan(got[i]) || std::isnan(want[i])) {
      ++s.nan;
      continue;
    }
    const double d = std::fabs(double(got[i]) - double(want[i]));
    const double ulp = bf16_out ? ulp_bf16(got[i], want[i])
                                : std::ldexp(1.0, std::ilogb(std::max(std::fabs(got[i]), std::fabs(want[i])) + 1e-38) - 23);
    s.exact += d == 0;
    s.within_ulp += d <= ulp;
    s.beyond_bound += d > bound[i] + ulp;
    if (ulp > 0) s.worst_ulps = std::max(s.worst_ulps, d / ulp);
  }
  return s;
}

void expect_agreement(const char* what, const Agreement& s, bool bf16_out) {
  std::printf("%-44s %8zu outputs: %6.2f%% exact, %7.3f%% within 1 ulp, worst %.2f ulp, %zu beyond bound, %zu NaN\n",
              what, s.total, 100.0 * s.exact / s.total, 100.0 * s.within_ulp / s.total, s.worst_ulps, s.beyond_bound,
              s.nan);
  EXPECT_EQ(s.nan, 0u) << what;
  EXPECT_EQ(s.beyond_bound, 0u) << what;
  if (bf16_out) EXPECT_GE(double(s.within_ulp), 0.999 * double(s.total)) << what;
}

std::vector<float> bf16_to_f32_vec(const uint16_t* p, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = bf16_to_f32(p[i]);
  return v;
}

// ---------------------------------------------------------------------------------------------
// FP8 block weights.

void check_fp8(int64_t rows, int N, int K) {
  CpuBackend cpu;
  const std::vector<uint16_t> x = random_bf16(rows, K);
  std::vector<uint8_t> w(size_t(N) * size_t(K));
  std::uniform_int_distribution<int> code(0, 253);
  for (auto& b : w) {
    const int c = code(rng());
    b = uint8_t(c >= 0x7f ? c + 1 : c);  // every code but the NaNs 0x7f and 0xff
  }
  const int kb = K / 128, nb = (N + 127) / 128;
  std::vector<uint8_t> w_scale(size_t(nb) * size_t(kb));
  std::uniform_int_distribution<int> sbyte(118, 134);
  for (auto& b : w_scale) b = uint8_t(sbyte(rng()));

  LinearWeight lw;
  lw.name = "test.fp8";
  lw.format = WeightFormat::FP8_BLOCK;
  lw.out = N;
  lw.in = K;
  lw.w = w.data();
  lw.scale = w_scale.data();
  Tensor yt = cpu.linear(cpu.from_host(DType::BF16, {rows, K}, x.data()), lw);

  // Host quantisation (the CPU codec) for the error bound and to check the scratch outputs.
  std::vector<uint8_t> want_q(x.size());
  std::vector<float> want_s(size_t(rows) * kb), block(128);
  for (size_t b = 0; b < want_s.size(); ++b) {
    for (int i = 0; i < 128; ++i) block[size_t(i)] = bf16_to_f32(x[b * 128 + size_t(i)]);
    want_s[b] = cpu::quantize_fp8_block(block.data(), 128, &want_q[b * 128]);
  }
  const float* lut = cpu::e4m3_table();
  std::vector<double> bound(size_t(rows) * size_t(N));
  for (int64_t r = 0; r < rows; ++r)
    for (int n = 0; n < N; ++n) {
      double s = 0;
      for (int b = 0; b < kb; ++b) {
        double partial = 0;
        for (int k = b * 128; k < (b + 1) * 128; ++k)
          partial += std::fabs(double(lut[want_q[size_t(r) * K + k]]) * lut[w[size_t(n) * K + k]]);
        s += partial * want_s[size_t(r) * kb + b] * e8m0_to_f32(w_scale[size_t(n / 128) * kb + b]);
      }
      bound[size_t(r) * N + n] = (K / 64 + 32) * kU * s;
    }

  Stream stream;
  DeviceBuffer<uint16_t> d_x(x.size()), d_y(size_t(rows) * N);
  DeviceBuffer<uint8_t> d_w(w.size()), d_ws(w_scale.size()), d_q(x.size());
  DeviceBuffer<float> d_s(want_s.size());
  d_x.upload(x, stream.get());
  d_w.upload(w, stream.get());
  d_ws.upload(w_scale, stream.get());
  d_y.fill_bytes(0xff, stream.get());
  d_q.fill_bytes(0x7f, stream.get());
  d_s.fill_bytes(0xff, stream.get());
  linear_fp8_block(d_x.get(), rows, K, d_w.get(), d_ws.get(), N, d_q.get(), d_s.get(), d_y.get(), stream.get());
  const std::vector<uint16_t> y = d_y.download(stream.get());
  const std::vector<uint8_t> q = d_q.download(stream.get());
  const std::vector<float> s = d_s.download(stream.get());
  EXPECT_EQ(q, want_q) << "activation codes";
  EXPECT_EQ(std::memcmp(s.data(), want_s.data(), s.size() * 4), 0) << "activation scales";

  char what[96];
  std::snprintf(what, sizeof what, "fp8 %lld × [%d × %d]", (long long)rows, N, K);
  expect_agreement(what,
                   compare(bf16_to_f32_vec(y.data(), y.size()), bf16_to_f32_vec(yt.ptr<uint16_t>(), y.size()), bound, true),
                   true);
}

// ---------------------------------------------------------------------------------------------
// bf16 weights: the four CPU ops the kernel family replaces.

enum class Bf16Op { LinearBf16, LinearF32FromBf16, LinearF32FromF32, GroupedOutProj };

const char* op_name(Bf16Op op) {
  switch (op) {
    case Bf16Op::LinearBf16: return "linear_bf16";
    case Bf16Op::LinearF32FromBf16: return "linear_f32 (bf16 x)";
    case Bf16Op::LinearF32FromF32: return "linear_f32 (f32 x)";
    case Bf16Op::GroupedOutProj: return "grouped_out_proj";
  }
  return "?";
}

// N outputs over K inputs per group (groups > 1 only for GroupedOutProj: N = groups · rank).
void check_bf16w(Bf16Op op, int64_t rows, int N, int K, int groups = 1) {
  CpuBackend cpu;
  const bool x_f32 = op == Bf16Op::LinearF32FromF32;
  const bool y_f32 = op == Bf16Op::LinearF32FromBf16 || op == Bf16Op::LinearF32FromF32;
  const int x_cols = groups * K;
  const std::vector<uint16_t> x_bf16 = random_bf16(rows, x_cols);
  std::vector<float> x_f(x_bf16.size());
  std::normal_distribution<float> nd(0.f, 1.f);
  for (size_t i = 0; i < x_f.size(); ++i) x_f[i] = x_f32 ? nd(rng()) : bf16_to_f32(x_bf16[i]);
  std::vector<uint16_t> w(size_t(N) * size_t(K));
  for (auto& v : w) v = f32_to_bf16(nd(rng()) * 0.05f);

  Tensor xt = x_f32 ? cpu.from_host(DType::F32, {rows, x_cols}, x_f.data())
                    : cpu.from_host(DType::BF16, {rows, x_cols}, x_bf16.data());
  Tensor yt;
  switch (op) {
    case Bf16Op::LinearBf16: yt = cpu.linear_bf16(xt, w.data(), N, K); break;
    case Bf16Op::LinearF32FromBf16:
    case Bf16Op::LinearF32FromF32: yt = cpu.linear_f32(xt, w.data(), N, K); break;
    case Bf16Op::GroupedOutProj: yt = cpu.grouped_out_proj(xt, w.data(), groups, N / groups); break;
  }
  std::vector<double> bound(size_t(rows) * size_t(N));
  const int cols_per_group = N / groups;
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < N; ++j) {
      const float* xr = x_f.data() + size_t(r) * x_cols + size_t(j / cols_per_group) * K;
      double s = 0;
      for (int k = 0; k < K; ++k) s += std::fabs(double(xr[k]) * bf16_to_f32(w[size_t(j) * K + k]));
      bound[size_t(r) * N + j] = (K / 32 + 8) * kU * s;
    }

  Stream stream;
  DeviceBuffer<float> d_xf(x_f32 ? x_f.size() : 0);
  DeviceBuffer<uint16_t> d_xb(x_f32 ? 0 : x_bf16.size()), d_w(w.size());
  DeviceBuffer<uint8_t> d_y(size_t(rows) * N * (y_f32 ? 4 : 2));
  if (x_f32) d_xf.upload(x_f, stream.get());
  else d_xb.upload(x_bf16, stream.get());
  d_w.upload(w, stream.get());
  d_y.fill_bytes(0xff, stream.get());
  const void* d_x = x_f32 ? static_cast<const void*>(d_xf.get()) : static_cast<const void*>(d_xb.get());
  linear_bf16w(d_x, x_f32, rows, K, x_cols, groups, d_w.get(), N, d_y.get(), y_f32, stream.get());
  const std::vector<uint8_t> y = d_y.download(stream.get());

  std::vector<float> got(size_t(rows) * N), want(got.size());
  if (y_f32) {
    std::memcpy(got.data(), y.data(), got.size() * 4);
    std::memcpy(want.data(), yt.ptr<float>(), got.size() * 4);
  } else {
    got = bf16_to_f32_vec(reinterpret_cast<const uint16_t*>(y.data()), got.size());
    want = bf16_to_f32_vec(yt.ptr<uint16_t>(), got.size());
  }
  char what[96];
  std::snprintf(what, sizeof what, "%s %lld × [%d × %d]%s", op_name(op), (long long)rows, N, K,
                groups > 1 ? " grouped" : "");
  expect_agreement(what, compare(got, want, bound, !y_f32), !y_f32);
}

TEST(LinearFp8Block, FixtureShapes) {
  // wq_a, wq_b, wkv, wo_b, shared w1/w3, shared w2, indexer wq_b, and N not a multiple of 128.
  const int shapes[][2] = {{128, 128}, {2048, 128}, {512, 128}, {128, 256}, {256, 128}, {200, 384}};
  for (auto [N, K] : shapes)
    for (int64_t rows : {1, 4, 33, 300}) check_fp8(rows, N, K);
  check_fp8(2000, 128, 128);  // many row blocks
}

TEST(LinearFp8Block, FlashShapes) {
  const int shapes[][2] = {{1024, 4096}, {32768, 1024}, {512, 4096}, {4096, 8192}, {2048, 4096}, {4096, 2048}, {8192, 1024}};
  for (auto [N, K] : shapes)
    for (int64_t rows : {1, 2}) check_fp8(rows, N, K);
  check_fp8(9, 1024, 4096);  // two passes of 8 rows
}

TEST(LinearBf16w, FixtureShapes) {
  for (int64_t rows : {1, 4, 33, 300}) {
    check_bf16w(Bf16Op::LinearF32FromBf16, rows, 1024, 128);  // head (logits), compressor wkv / wgate
    check_bf16w(Bf16Op::LinearF32FromBf16, rows, 512, 128);
    check_bf16w(Bf16Op::LinearF32FromBf16, rows, 8, 128);      // gate
    check_bf16w(Bf16Op::LinearBf16, rows, 4, 128);             // indexer weights_proj
    check_bf16w(Bf16Op::LinearBf16, rows, 1024, 128);
    check_bf16w(Bf16Op::LinearF32FromF32, rows, 256, 128);
    check_bf16w(Bf16Op::GroupedOutProj, rows, 2 * 128, 1024, 2);
  }
}

TEST(LinearBf16w, FlashShapes) {
  check_bf16w(Bf16Op::LinearF32FromBf16, 1, 129280, 4096);  // head
  for (int64_t rows : {1, 2}) {
    check_bf16w(Bf16Op::LinearF32FromBf16, rows, 256, 4096);   // gate
    check_bf16w(Bf16Op::LinearF32FromBf16, rows, 1024, 4096);  // compressor
    check_bf16w(Bf16Op::LinearBf16, rows, 64, 4096);           // indexer weights_proj
    check_bf16w(Bf16Op::GroupedOutProj, rows, 8 * 1024, 4096, 8);
  }
}

// Narrow linears with long rows split K over up to 8 warps per column (linear.cu): ragged column
// counts (inactive warps in the last block), several 8-row passes and 64-row blocks.
TEST(LinearSplitK, NarrowLinears) {
  for (int64_t rows : {1, 3, 17, 70}) {
    check_fp8(rows, 200, 4096);   // 8 slices, the last block partly empty
    check_fp8(rows, 1000, 2048);  // 4 slices
    check_bf16w(Bf16Op::LinearF32FromBf16, rows, 37, 2048);
    check_bf16w(Bf16Op::LinearBf16, rows, 1500, 4096);
    check_bf16w(Bf16Op::LinearF32FromF32, rows, 100, 1024);
    check_bf16w(Bf16Op::GroupedOutProj, rows, 2 * 64, 2048, 2);
  }
}

TEST(LinearBf16w, ElementLoadsWhenUnaligned) {
  for (int64_t rows : {1, 5, 70}) {
    check_bf16w(Bf16Op::LinearBf16, rows, 64, 100);
    check_bf16w(Bf16Op::LinearF32FromF32, rows, 33, 57);
    check_bf16w(Bf16Op::GroupedOutProj, rows, 3 * 16, 36, 3);
  }
}

TEST(LinearSanitizer, Small) {
  check_fp8(5, 200, 256);
  check_fp8(9, 20, 1024);  // split K
  check_bf16w(Bf16Op::LinearBf16, 9, 20, 1024);
  check_bf16w(Bf16Op::LinearBf16, 9, 24, 128);
  check_bf16w(Bf16Op::LinearF32FromF32, 3, 16, 40);
  check_bf16w(Bf16Op::GroupedOutProj, 2, 2 * 8, 64, 2);
}

}  // namespace
}  // namespace dsv4::cuda
