// Hyper-connection kernels (backend/cuda/hyper_connection.h) against CpuBackend::hc_pre / hc_post /
// hc_head on fresh random inputs, at the fixtures' shape (D = 128) and DeepSeek-V4-Flash's (D = 4096,
// hc = 4: 24 mixes over 16384 channels). Outputs are poisoned with 0xff (NaN) first; a NaN anywhere
// fails. hc_post is checked bit for bit; hc_pre / hc_head with the bounds derived below.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/act_quant_fp8.h"
#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/hyper_connection.h"
#include "backend/cuda/row_ops.h"
#include "core/dtypes.h"
#include "core/error.h"
#include "gpu_test_rng.h"

namespace dsv4::cuda {
namespace {

std::mt19937& rng() { return test::fresh_rng("hyper_connection_gpu_test"); }

CpuBackend& cpu() {
  static CpuBackend backend;
  return backend;
}

constexpr float kNormEps = 1e-6f, kHcEps = 1e-6f;

// Residual streams X [T, hc, D]: token magnitude 2^e, e in [−30, 20] (rs normalises it away, up to
// eps), each stream a further 2^[−4, 4]; token 1 all zero (rs = 1/sqrt(eps), m = 0).
std::vector<uint16_t> random_streams(int64_t T, int hc, int D) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> token_exp(-30, 20), stream_exp(-4, 4);
  std::vector<uint16_t> X(static_cast<size_t>(T * hc * D));
  for (int64_t t = 0; t < T; ++t) {
    const int e = token_exp(rng());
    for (int a = 0; a < hc; ++a) {
      const float mag = t == 1 ? 0.f : std::ldexp(1.0f, e + stream_exp(rng()));
      for (int d = 0; d < D; ++d) X[size_t((t * hc + a) * D + d)] = dsv4::f32_to_bf16(nd(rng()) * mag);
    }
  }
  return X;
}

// Mixing weights: fn ~ N(0, (2/sqrt(hc·D))²) so the mixes m are ~N(0, 4) and the sigmoids and the
// softmax see their whole range; base ~ N(0, 1); scale ~ U(0.5, 2).
struct HcWeights {
  std::vector<float> fn, base, scale;
};

HcWeights random_weights(int n_mix, int width, int n_scale) {
  std::normal_distribution<float> fd(0.f, 2.0f / std::sqrt(float(width))), bd(0.f, 1.f);
  std::uniform_real_distribution<float> sd(0.5f, 2.0f);
  HcWeights w;
  w.fn.resize(size_t(n_mix) * width);
  w.base.resize(size_t(n_mix));
  w.scale.resize(size_t(n_scale));
  for (auto& v : w.fn) v = fd(rng());
  for (auto& v : w.base) v = bd(rng());
  for (auto& v : w.scale) v = sd(rng());
  return w;
}

template <typename T>
std::vector<T> contents(const Tensor& t) {
  std::vector<T> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data, t.nbytes());
  return v;
}

bool is_nan_bf16(uint16_t h) { return (h & 0x7fff) > 0x7f80; }
int ordered_bf16(uint16_t h) { return (h & 0x8000) ? -int(h & 0x7fff) : int(h); }

// One bf16 ulp at |v| (the subnormal spacing below the normal range).
float bf16_ulp(float v) {
  v = std::fabs(v);
  return v < 0x1p-126f ? 0x1p-133f : std::ldexp(1.0f, std::ilogb(v) - 7);
}

// f32 outputs in [0, 2] (post) or [0, 1] (comb): absolute differences.
size_t count_nan(const std::vector<float>& v) {
  return size_t(std::count_if(v.begin(), v.end(), [](float f) { return std::isnan(f); }));
}

float max_abs_diff(const std::vector<float>& got, const std::vector<float>& want) {
  float m = 0;
  for (size_t i = 0; i < want.size(); ++i) m = std::max(m, std::fabs(got[i] - want[i]));
  return m;
}

// The mixes m: the CPU sums 16384 products in double; the GPU's products are exact (bf16 streams times
// the three bf16 parts of each f32 weight) and its sums f32: per 256-channel slice 16 tensor-core sums
// of 16 products (each chained through the three parts) added in order, then the 64 slices 2 per lane
// and a 5-level tree: ~25 roundings deep. The tensor cores truncate where f32 rounds (an error of up
// to an ulp instead of half, of the same random sign as the product it cuts), so the errors are a
// random walk of standard deviation ≲ 2^-23·√25·(partial sums ≤ |m|-sized), i.e. ≲ 6e-7 of m's own
// spread (σ_m ≈ 2 here): |Δm| ≲ 8e-6 even at 6 sd. Through
// post = 2σ(m·s + b) (slope ≤ s/2 ≤ 1) and the softmax / Sinkhorn (slope ≲ s ≤ 2 on the logits, the
// normalisations divide out common factors) post and comb move by ≲ 2e-5. Bound: 5e-5 absolute, which
// is still 2^-14 — far below anything a bf16 consumer can see.
constexpr float kMixTolerance = 5e-5f;

// x_in = bf16(Σ_j pre_j·X_j): the same f32 steps given the same pre; pre = σ(m·s0 + b) + eps moves by
// ≤ |Δm|·s0/4 ≲ 1e-5 (above), so the f32 sum moves by ≤ 1e-5·Σ_j|X_j[d]| (bound: 2e-5·Σ_j|X_j[d]|,
// covering cancellation), plus the final bf16 rounding: 1 ulp. Elements that differ at all: those
// near a midpoint, ~1e-6 / 2^-8 ≲ 1e-3 of them; bound 4 + 1 %.
void check_streams_output(const char* what, const std::vector<uint16_t>& got, const std::vector<uint16_t>& want,
                          const std::vector<uint16_t>& X, int64_t T, int hc, int D) {
  size_t differ = 0, nan = 0, beyond = 0;
  int max_ulp = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int d = 0; d < D; ++d) {
      const size_t i = size_t(t * D + d);
      if (is_nan_bf16(got[i])) { ++nan; continue; }
      if (got[i] == want[i]) continue;
      ++differ;
      max_ulp = std::max(max_ulp, std::abs(ordered_bf16(got[i]) - ordered_bf16(want[i])));
      float stream_sum = 0;
      for (int a = 0; a < hc; ++a) stream_sum += std::fabs(bf16_to_f32(X[size_t((t * hc + a) * D + d)]));
      const float g = bf16_to_f32(got[i]), w = bf16_to_f32(want[i]);
      const float tol = bf16_ulp(std::max(std::fabs(g), std::fabs(w))) + 2e-5f * stream_sum;
      if (std::fabs(g - w) > tol) ++beyond;
    }
  std::printf("%s x_in: %zu of %lld differ (max %d ulp), %zu beyond the bound, %zu NaN\n", what, differ,
              (long long)(T * D), max_ulp, beyond, nan);
  EXPECT_EQ(nan, 0u) << what;
  EXPECT_EQ(beyond, 0u) << what;
  EXPECT_LE(differ, 4 + size_t(T * D) / 100) << what;
}

struct HcPreResult {
  std::vector<uint16_t> out;
  std::vector<float> post, comb;
  std::vector<uint8_t> q;  // with quant: x_in's FP8 codes, scales and values (Fp8Rows)
  std::vector<float> s;
  std::vector<uint16_t> values;
};

// The mix kernels' inputs on the device: X, fn, base, scale, and the norm when given one.
struct DeviceMixInputs {
  DeviceBuffer<uint16_t> X, norm;
  DeviceBuffer<float> fn, base, scale;
  DeviceMixInputs(const std::vector<uint16_t>& x, const HcWeights& w, const std::vector<uint16_t>* n, int D,
                  cudaStream_t stream)
      : X(x.size()), norm(static_cast<size_t>(D)), fn(w.fn.size()), base(w.base.size()), scale(w.scale.size()) {
    X.upload(x, stream);
    fn.upload(w.fn, stream);
    base.upload(w.base, stream);
    scale.upload(w.scale, stream);
    if (n) norm.upload(*n, stream);
  }
};

// hc_pre on the GPU (with a norm when given one); every output and the scratch poisoned first.
// x_in's FP8 codes, scales and values written beside it (Fp8Rows), poisoned first.
struct DeviceQuant {
  DeviceBuffer<uint8_t> q;
  DeviceBuffer<float> s;
  DeviceBuffer<uint16_t> values;
  DeviceQuant(int64_t T, int D, cudaStream_t stream) : q(size_t(T * D)), s(size_t(T * D / 128)), values(size_t(T * D)) {
    if (!T) return;  // (not asked for)
    q.fill_bytes(0xff, stream);
    s.fill_bytes(0xff, stream);
    values.fill_bytes(0xff, stream);
  }
  Fp8Rows rows() { return {q.get(), s.get(), values.get()}; }
  void download(HcPreResult& r, cudaStream_t stream) {
    r.q = q.download(stream);
    r.s = s.download(stream);
    r.values = values.download(stream);
  }
};

HcPreResult gpu_hc_pre(const std::vector<uint16_t>& X, int64_t T, int hc, int D, const HcWeights& w, int iters,
                       const std::vector<uint16_t>* norm = nullptr, unsigned* ticket = nullptr, bool quant = false) {
  Stream stream;
  DeviceMixInputs in(X, w, norm, D, stream.get());
  DeviceBuffer<uint16_t> d_out(size_t(T * D));
  DeviceBuffer<float> d_post(size_t(T * hc)), d_comb(size_t(T * hc * hc));
  DeviceBuffer<float> d_partials(size_t(hc_mix_scratch_floats(T, hc, D, false)));
  DeviceQuant d_quant(quant ? T : 0, D, stream.get());
  d_out.fill_bytes(0xff, stream.get());
  d_post.fill_bytes(0xff, stream.get());
  d_comb.fill_bytes(0xff, stream.get());
  d_partials.fill_bytes(0xff, stream.get());
  hc_pre(in.X.get(), T, hc, D, in.fn.get(), in.base.get(), in.scale.get(), iters, kNormEps, kHcEps, d_partials.get(),
         norm ? in.norm.get() : nullptr, d_out.get(), d_post.get(), d_comb.get(), stream.get(), ticket,
         quant ? d_quant.rows() : Fp8Rows{});
  DSV4_CUDA_CHECK_LAUNCH();
  HcPreResult r{d_out.download(stream.get()), d_post.download(stream.get()), d_comb.download(stream.get())};
  if (quant) d_quant.download(r, stream.get());
  return r;
}

// act_quant_fp8 of rows on the GPU: the op the codes beside x_in must match.
HcPreResult gpu_act_quant(const std::vector<uint16_t>& x, int64_t T, int D) {
  Stream stream;
  DeviceBuffer<uint16_t> d_x(x.size());
  d_x.upload(x, stream.get());
  DeviceQuant d_quant(T, D, stream.get());
  act_quant_fp8(d_x.get(), int(T), D, d_quant.q.get(), d_quant.s.get(), d_quant.values.get(), stream.get());
  DSV4_CUDA_CHECK_LAUNCH();
  HcPreResult r;
  d_quant.download(r, stream.get());
  return r;
}

void expect_same_quant(const HcPreResult& got, const HcPreResult& want, const std::string& what) {
  EXPECT_TRUE(got.q == want.q) << what << ": codes";
  EXPECT_TRUE(got.s.size() == want.s.size() && std::memcmp(got.s.data(), want.s.data(), want.s.size() * 4) == 0)
      << what << ": scales";
  EXPECT_TRUE(got.values == want.values) << what << ": values";
}

void check_hc_pre(int64_t T, int hc, int D, int iters) {
  const int width = hc * D, n_mix = (2 + hc) * hc;
  const std::vector<uint16_t> X = random_streams(T, hc, D);
  const HcWeights w = random_weights(n_mix, width, 3);
  HyperConnection host_hc;
  host_hc.fn = w.fn.data();
  host_hc.base = w.base.data();
  host_hc.scale = w.scale.data();
  Tensor post_t, comb_t;
  const Tensor out_t = cpu().hc_pre(cpu().from_host(DType::BF16, {T, hc, D}, X.data()), host_hc, hc, iters, kNormEps,
                                    kHcEps, &post_t, &comb_t, nullptr);
  const std::vector<uint16_t> want_out = contents<uint16_t>(out_t);
  const std::vector<float> want_post = contents<float>(post_t), want_comb = contents<float>(comb_t);

  const HcPreResult got = gpu_hc_pre(X, T, hc, D, w, iters);
  const float post_err = max_abs_diff(got.post, want_post), comb_err = max_abs_diff(got.comb, want_comb);
  char what[96];
  std::snprintf(what, sizeof what, "hc_pre T %lld hc %d D %d iters %d", (long long)T, hc, D, iters);
  std::printf("%s: max |Δpost| %.3g, max |Δcomb| %.3g\n", what, post_err, comb_err);
  EXPECT_EQ(count_nan(got.post), 0u) << what;
  EXPECT_EQ(count_nan(got.comb), 0u) << what;
  EXPECT_LE(post_err, kMixTolerance) << what;
  EXPECT_LE(comb_err, kMixTolerance) << what;
  check_streams_output(what, got.out, want_out, X, T, hc, D);
}

// A token's mixes and x_in are the same bits alone, at any place in a batch and in batches of any
// size (the slices and their order do not depend on T): decode steps of different batch sizes and
// prefill chunks give a sequence the same numbers.
TEST(HyperConnectionPre, RowsDoNotDependOnTheBatch) {
  // 64 tokens: a decode batch's partials (tiles past the first, rows g + 8); 70: the prefill form's
  // partials, x_in one block a token, alone several; 2100: a partials block walks 4 token groups, and the
  // finishing blocks of a prefill chunk (Flash's width, and a width whose last slice is cut short).
  for (const auto& [D, T] : std::vector<std::pair<int, int>>{{4096, 64}, {4096, 70}, {68, 70}, {128, 2100}, {4096, 2100}, {68, 2100}}) {
    const int hc = 4;
    const std::vector<uint16_t> X = random_streams(T, hc, D);
    const HcWeights w = random_weights((2 + hc) * hc, hc * D, 3);
    const HcPreResult all = gpu_hc_pre(X, T, hc, D, w, 20);
    for (int64_t first : {0, 5, 33, 69, 1234, 2097})
      for (int64_t n : {1, 3, 7}) {
        if (first + n > T) continue;
        const std::vector<uint16_t> part(X.begin() + first * hc * D, X.begin() + (first + n) * hc * D);
        const HcPreResult got = gpu_hc_pre(part, n, hc, D, w, 20);
        EXPECT_TRUE(std::equal(got.out.begin(), got.out.end(), all.out.begin() + first * D))
            << "x_in of tokens " << first << "+" << n << " at D " << D;
        EXPECT_TRUE(std::equal(got.post.begin(), got.post.end(), all.post.begin() + first * hc)) << first << "+" << n;
        EXPECT_TRUE(std::equal(got.comb.begin(), got.comb.end(), all.comb.begin() + first * hc * hc)) << first << "+" << n;
      }
  }
}

TEST(HyperConnectionPre, MatchesCpu) {
  for (int64_t T : {1, 3, 37}) {
    check_hc_pre(T, 4, 128, 20);   // fixture
    check_hc_pre(T, 4, 4096, 20);  // Flash
  }
  check_hc_pre(3, 4, 128, 1);    // the softmax and one column normalisation only
  check_hc_pre(3, 4, 68, 20);    // a width of 68 chunks: one slice and a part, lanes idle in both
  check_hc_pre(300, 4, 128, 20);
  // Prefill-sized chunks (many token groups per slice).
  check_hc_pre(517, 4, 128, 20);
  check_hc_pre(1029, 4, 4096, 20);
  check_hc_pre(2100, 4, 128, 20);  // partials blocks walking 8 token groups each
}

// hc_head on the GPU (with a norm when given one); the output and the scratch poisoned first.
std::vector<uint16_t> gpu_hc_head(const std::vector<uint16_t>& X, int64_t T, int hc, int D, const HcWeights& w,
                                  const std::vector<uint16_t>* norm = nullptr, unsigned* ticket = nullptr) {
  Stream stream;
  DeviceMixInputs in(X, w, norm, D, stream.get());
  DeviceBuffer<uint16_t> d_out(size_t(T * D));
  DeviceBuffer<float> d_partials(size_t(hc_mix_scratch_floats(T, hc, D, true)));
  d_out.fill_bytes(0xff, stream.get());
  d_partials.fill_bytes(0xff, stream.get());
  hc_head(in.X.get(), T, hc, D, in.fn.get(), in.base.get(), in.scale.get(), kNormEps, kHcEps, d_partials.get(),
          norm ? in.norm.get() : nullptr, d_out.get(), stream.get(), ticket);
  DSV4_CUDA_CHECK_LAUNCH();
  return d_out.download(stream.get());
}

void check_hc_head(int64_t T, int hc, int D) {
  const int width = hc * D;
  const std::vector<uint16_t> X = random_streams(T, hc, D);
  const HcWeights w = random_weights(hc, width, 1);
  HyperConnection host_hc;
  host_hc.fn = w.fn.data();
  host_hc.base = w.base.data();
  host_hc.scale = w.scale.data();
  const std::vector<uint16_t> want = contents<uint16_t>(
      cpu().hc_head(cpu().from_host(DType::BF16, {T, hc, D}, X.data()), host_hc, hc, kNormEps, kHcEps, nullptr));
  char what[96];
  std::snprintf(what, sizeof what, "hc_head T %lld hc %d D %d", (long long)T, hc, D);
  check_streams_output(what, gpu_hc_head(X, T, hc, D, w), want, X, T, hc, D);
}

// rms_norm of bf16 rows [rows, D] on the GPU (row_ops.h), the op the mixes' norm must equal.
std::vector<uint16_t> gpu_rms_norm(const std::vector<uint16_t>& x, int64_t rows, int D, const std::vector<uint16_t>& w) {
  Stream stream;
  DeviceBuffer<uint16_t> d_x(x.size()), d_w(w.size()), d_y(x.size());
  d_x.upload(x, stream.get());
  d_w.upload(w, stream.get());
  d_y.fill_bytes(0xff, stream.get());
  rms_norm(d_x.get(), d_w.get(), rows, D, kNormEps, d_y.get(), stream.get());
  DSV4_CUDA_CHECK_LAUNCH();
  return d_y.download(stream.get());
}

std::vector<uint16_t> random_norm(int D) {
  std::normal_distribution<float> nd(1.f, 0.5f);
  std::vector<uint16_t> w(size_t(D), 0);
  for (auto& v : w) v = dsv4::f32_to_bf16(nd(rng()));
  return w;
}

// With a norm, hc_pre and hc_head return the bits of their plain output put through the rms_norm op
// (post and comb unchanged): the fused finishing block repeats rms_norm's summation order.
TEST(HyperConnectionNorm, SameBitsAsTheRmsNormOpAfter) {
  for (const auto& [D, T] : std::vector<std::pair<int, int>>{{4096, 1}, {4096, 5}, {4096, 70}, {128, 3}, {128, 2100}, {8192, 2}}) {
    const int hc = 4;
    const std::vector<uint16_t> X = random_streams(T, hc, D), norm = random_norm(D);
    const HcWeights w = random_weights((2 + hc) * hc, hc * D, 3);
    const HcPreResult plain = gpu_hc_pre(X, T, hc, D, w, 20), normed = gpu_hc_pre(X, T, hc, D, w, 20, &norm);
    const std::vector<uint16_t> want = gpu_rms_norm(plain.out, T, D, norm);
    EXPECT_EQ(normed.out, want) << "hc_pre + norm, T " << T << " D " << D;
    EXPECT_EQ(normed.post, plain.post) << "T " << T << " D " << D;
    EXPECT_EQ(normed.comb, plain.comb) << "T " << T << " D " << D;
    EXPECT_EQ(count_nan(normed.comb), 0u);
    const HcWeights wh = random_weights(hc, hc * D, 1);
    EXPECT_EQ(gpu_hc_head(X, T, hc, D, wh, &norm), gpu_rms_norm(gpu_hc_head(X, T, hc, D, wh), T, D, norm))
        << "hc_head + norm, T " << T << " D " << D;
  }
}

TEST(HyperConnectionHead, MatchesCpu) {
  for (int64_t T : {1, 3, 37}) {
    check_hc_head(T, 4, 128);
    check_hc_head(T, 4, 4096);
  }
}

// hc_post: the same f32 operations in the same order on the same inputs — bit-exact. Also run in
// place (out = X), which the kernel allows.
void check_hc_post(int64_t T, int hc, int D, bool in_place) {
  const std::vector<uint16_t> X = random_streams(T, hc, D);
  std::vector<uint16_t> y(static_cast<size_t>(T * D));
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> e(-20, 10);
  for (int64_t t = 0; t < T; ++t) {
    const float mag = std::ldexp(1.0f, e(rng()));
    for (int d = 0; d < D; ++d) y[size_t(t * D + d)] = dsv4::f32_to_bf16(nd(rng()) * mag);
  }
  std::uniform_real_distribution<float> pd(0.f, 2.f), cd(0.f, 1.f);
  std::vector<float> post(static_cast<size_t>(T * hc)), comb(static_cast<size_t>(T * hc * hc));
  for (auto& v : post) v = pd(rng());
  for (auto& v : comb) v = cd(rng());
  const std::vector<uint16_t> want = contents<uint16_t>(cpu().hc_post(
      cpu().from_host(DType::BF16, {T, D}, y.data()), cpu().from_host(DType::BF16, {T, hc, D}, X.data()),
      cpu().from_host(DType::F32, {T, hc}, post.data()), cpu().from_host(DType::F32, {T, hc, hc}, comb.data())));

  Stream stream;
  DeviceBuffer<uint16_t> d_y(y.size()), d_X(X.size()), d_out(X.size());
  DeviceBuffer<float> d_post(post.size()), d_comb(comb.size());
  d_y.upload(y, stream.get());
  d_X.upload(X, stream.get());
  d_post.upload(post, stream.get());
  d_comb.upload(comb, stream.get());
  d_out.fill_bytes(0xff, stream.get());
  uint16_t* out = in_place ? d_X.get() : d_out.get();
  hc_post(d_y.get(), d_X.get(), d_post.get(), d_comb.get(), T, hc, D, out, stream.get());
  DSV4_CUDA_CHECK_LAUNCH();
  const std::vector<uint16_t> got = in_place ? d_X.download(stream.get()) : d_out.download(stream.get());
  size_t differ = 0, nan = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    nan += is_nan_bf16(got[i]);
    differ += got[i] != want[i];
  }
  std::printf("hc_post T %lld hc %d D %d%s: %zu of %zu differ, %zu NaN\n", (long long)T, hc, D,
              in_place ? " in place" : "", differ, want.size(), nan);
  EXPECT_EQ(nan, 0u);
  EXPECT_EQ(differ, 0u);
}

TEST(HyperConnectionPost, MatchesCpuBitExact) {
  for (int64_t T : {1, 3, 37}) {
    check_hc_post(T, 4, 128, false);
    check_hc_post(T, 4, 4096, false);
  }
  check_hc_post(37, 4, 4096, true);
  check_hc_post(5, 2, 256, false);
  // From 64 rows, 8 channels a thread where D allows (in place too); D = 68 keeps a channel a thread.
  check_hc_post(64, 4, 4096, false);
  check_hc_post(70, 4, 4096, true);
  check_hc_post(64, 2, 256, false);
  check_hc_post(70, 4, 68, false);
  check_hc_post(64, 3, 68, true);
}

// hc_post_pre against hc_post then hc_pre on the GPU (each held to the CPU above): the same state
// written out and the same x_in, post and comb, bit for bit. Every output poisoned first.
void check_hc_post_pre(int64_t T, int D, bool with_norm, unsigned* ticket = nullptr, bool quant = false) {
  const int hc = 4;
  const std::vector<uint16_t> X = random_streams(T, hc, D);
  std::vector<uint16_t> y(static_cast<size_t>(T * D));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : y) v = dsv4::f32_to_bf16(nd(rng()));
  std::uniform_real_distribution<float> pd(0.f, 2.f), cd(0.f, 1.f);
  std::vector<float> post(static_cast<size_t>(T * hc)), comb(static_cast<size_t>(T * hc * hc));
  for (auto& v : post) v = pd(rng());
  for (auto& v : comb) v = cd(rng());
  const HcWeights w = random_weights(24, hc * D, 3);
  const std::vector<uint16_t> norm = random_norm(D);
  Stream stream;
  DeviceMixInputs in(X, w, with_norm ? &norm : nullptr, D, stream.get());
  DeviceBuffer<uint16_t> d_y(y.size()), d_Xa(X.size()), d_Xa2(X.size()), d_out(size_t(T * D)), d_out2(size_t(T * D));
  DeviceBuffer<float> d_post_in(post.size()), d_comb_in(comb.size()), d_post(post.size()), d_comb(comb.size()),
      d_post2(post.size()), d_comb2(comb.size()), d_partials(size_t(hc_mix_scratch_floats(T, hc, D, false)));
  d_y.upload(y, stream.get());
  d_post_in.upload(post, stream.get());
  d_comb_in.upload(comb, stream.get());
  for (auto* b : {&d_Xa, &d_Xa2, &d_out, &d_out2}) b->fill_bytes(0xff, stream.get());
  for (auto* b : {&d_post, &d_comb, &d_post2, &d_comb2, &d_partials}) b->fill_bytes(0xff, stream.get());
  const uint16_t* n = with_norm ? in.norm.get() : nullptr;
  hc_post(d_y.get(), in.X.get(), d_post_in.get(), d_comb_in.get(), T, hc, D, d_Xa.get(), stream.get());
  hc_pre(d_Xa.get(), T, hc, D, in.fn.get(), in.base.get(), in.scale.get(), 20, kNormEps, kHcEps, d_partials.get(), n,
         d_out.get(), d_post.get(), d_comb.get(), stream.get());
  d_partials.fill_bytes(0xff, stream.get());
  DeviceQuant d_quant(quant ? T : 0, D, stream.get());
  hc_post_pre(d_y.get(), in.X.get(), d_post_in.get(), d_comb_in.get(), T, hc, D, d_Xa2.get(), in.fn.get(), in.base.get(),
              in.scale.get(), 20, kNormEps, kHcEps, d_partials.get(), n, d_out2.get(), d_post2.get(), d_comb2.get(),
              stream.get(), ticket, quant ? d_quant.rows() : Fp8Rows{});
  DSV4_CUDA_CHECK_LAUNCH();
  const auto bits = [](const std::vector<float>& v) {
    std::vector<uint32_t> u(v.size());
    std::memcpy(u.data(), v.data(), v.size() * 4);
    return u;
  };
  const std::string what = "hc_post_pre T " + std::to_string(T) + " D " + std::to_string(D) + (with_norm ? " normed" : "") +
                           (ticket ? " (one launch)" : "");
  EXPECT_TRUE(d_Xa2.download(stream.get()) == d_Xa.download(stream.get())) << what << ": the state";
  EXPECT_TRUE(d_out2.download(stream.get()) == d_out.download(stream.get())) << what << ": x_in";
  EXPECT_TRUE(bits(d_post2.download(stream.get())) == bits(d_post.download(stream.get()))) << what << ": post";
  EXPECT_TRUE(bits(d_comb2.download(stream.get())) == bits(d_comb.download(stream.get()))) << what << ": comb";
  if (quant) {
    HcPreResult got;
    d_quant.download(got, stream.get());
    expect_same_quant(got, gpu_act_quant(d_out.download(stream.get()), T, D), what + ", act_quant of x_in");
  }
  std::printf("%s: checked bit for bit against hc_post then hc_pre%s\n", what.c_str(), quant ? " (and act_quant)" : "");
}

TEST(HyperConnectionPostPre, SameBitsAsPostThenPre) {
  for (int64_t T : {1, 5, 64}) {
    check_hc_post_pre(T, 4096, true);   // Flash, the norm fused
    check_hc_post_pre(T, 128, false);   // fixture width
  }
}

// The decode form (a ticket: partial sums and the finishing work in one launch, for up to 2 rows) gives
// the bits of the two launches, launch after launch (each leaves its ticket zeroed for the next), and
// the fused hc_post_pre those of hc_post then hc_pre.
unsigned ticket_value(const DeviceBuffer<unsigned>& ticket) { return ticket.download()[0]; }

TEST(HyperConnectionFused, SameBitsAsTwoLaunches) {
  DeviceBuffer<unsigned> ticket(1);
  ticket.fill_bytes(0);
  DSV4_CUDA_CHECK(cudaDeviceSynchronize());  // (the tests' streams do not wait for the default one)
  const int hc = 4;
  for (const auto& [D, T] : std::vector<std::pair<int, int>>{{4096, 1}, {4096, 2}, {128, 1}, {128, 2}, {8192, 1}, {68, 2}}) {
    const std::vector<uint16_t> X = random_streams(T, hc, D), norm = random_norm(D);
    const HcWeights w = random_weights((2 + hc) * hc, hc * D, 3), wh = random_weights(hc, hc * D, 1);
    for (bool with_norm : {false, true}) {
      if (with_norm && D % 8) continue;  // (a norm needs 8-channel chunks)
      const std::vector<uint16_t>* n = with_norm ? &norm : nullptr;
      const std::string what = "T " + std::to_string(T) + " D " + std::to_string(D) + (with_norm ? " normed" : "");
      const HcPreResult two = gpu_hc_pre(X, T, hc, D, w, 20, n);
      for (int launch = 0; launch < 2; ++launch) {
        const HcPreResult one = gpu_hc_pre(X, T, hc, D, w, 20, n, ticket.get());
        EXPECT_EQ(one.out, two.out) << "hc_pre x_in, " << what << ", launch " << launch;
        EXPECT_EQ(0, std::memcmp(one.post.data(), two.post.data(), two.post.size() * 4)) << "hc_pre post, " << what;
        EXPECT_EQ(0, std::memcmp(one.comb.data(), two.comb.data(), two.comb.size() * 4)) << "hc_pre comb, " << what;
        EXPECT_EQ(ticket_value(ticket), 0u) << what;
      }
      EXPECT_EQ(gpu_hc_head(X, T, hc, D, wh, n, ticket.get()), gpu_hc_head(X, T, hc, D, wh, n)) << "hc_head, " << what;
      EXPECT_EQ(ticket_value(ticket), 0u) << what;
      check_hc_post_pre(T, D, with_norm, ticket.get());
      EXPECT_EQ(ticket_value(ticket), 0u) << what;
    }
  }
  // Rows past the decode form's take the two launches, with the ticket given or not.
  check_hc_post_pre(5, 4096, true, ticket.get());
  EXPECT_EQ(ticket_value(ticket), 0u);
}

// The normed x_in's FP8 codes written beside it (Fp8Rows: the linears after it skip their quantising
// launch) are act_quant_fp8's of x_in, bit for bit, in both forms of hc_pre and hc_post_pre; x_in,
// post and comb are those without the codes.
TEST(HyperConnectionQuant, CodesBesideXInAsActQuant) {
  DeviceBuffer<unsigned> ticket(1);
  ticket.fill_bytes(0);
  DSV4_CUDA_CHECK(cudaDeviceSynchronize());
  const int hc = 4;
  for (const auto& [D, T] : std::vector<std::pair<int, int>>{{4096, 1}, {4096, 2}, {4096, 5}, {256, 3}, {8192, 2}, {4096, 64}}) {
    const std::vector<uint16_t> X = random_streams(T, hc, D), norm = random_norm(D);
    const HcWeights w = random_weights((2 + hc) * hc, hc * D, 3);
    const HcPreResult plain = gpu_hc_pre(X, T, hc, D, w, 20, &norm);
    const HcPreResult want = gpu_act_quant(plain.out, T, D);
    for (unsigned* t : {static_cast<unsigned*>(nullptr), ticket.get()}) {
      const std::string what = "hc_pre T " + std::to_string(T) + " D " + std::to_string(D) + (t ? " (one launch)" : "");
      const HcPreResult got = gpu_hc_pre(X, T, hc, D, w, 20, &norm, t, true);
      EXPECT_EQ(got.out, plain.out) << what;
      EXPECT_EQ(0, std::memcmp(got.post.data(), plain.post.data(), plain.post.size() * 4)) << what;
      EXPECT_EQ(0, std::memcmp(got.comb.data(), plain.comb.data(), plain.comb.size() * 4)) << what;
      expect_same_quant(got, want, what);
      EXPECT_EQ(ticket_value(ticket), 0u) << what;
      check_hc_post_pre(T, D, true, t, true);
      EXPECT_EQ(ticket_value(ticket), 0u) << what;
    }
  }
  // Without the norm, or at a width of no multiple of 256, the op refuses the codes.
  const std::vector<uint16_t> X = random_streams(1, hc, 128), norm = random_norm(128);
  EXPECT_THROW(gpu_hc_pre(X, 1, hc, 128, random_weights(24, 512, 3), 20, &norm, nullptr, true), Error);
  EXPECT_FALSE(hc_norm_quant_fits(128, Fp8Rows{}));
}

TEST(HyperConnectionSanitizer, Small) {
  check_hc_pre(3, 4, 128, 20);
  check_hc_pre(2, 4, 64, 3);
  check_hc_head(3, 4, 128);
  check_hc_post(3, 4, 128, false);
  check_hc_post(2, 4, 128, true);
  check_hc_post(64, 4, 128, true);  // 8 channels a thread
  check_hc_pre(530, 4, 64, 3);  // a prefill-sized chunk
  check_hc_pre(2049, 4, 68, 3);  // partials blocks walking 8 token groups, the last one token
  check_hc_post_pre(3, 128, true);
  const std::vector<uint16_t> X = random_streams(3, 4, 256), norm = random_norm(256);
  const HcPreResult normed = gpu_hc_pre(X, 3, 4, 256, random_weights(24, 1024, 3), 20, &norm);  // the fused norm
  EXPECT_EQ(normed.out.size(), 3u * 256);
  DeviceBuffer<unsigned> ticket(1);  // the one-launch decode form
  ticket.fill_bytes(0);
  DSV4_CUDA_CHECK(cudaDeviceSynchronize());
  check_hc_post_pre(2, 256, true, ticket.get(), true);
  EXPECT_EQ(gpu_hc_pre(X, 2, 4, 256, random_weights(24, 1024, 3), 20, &norm, ticket.get(), true).q.size(), 2u * 256);
}

}  // namespace
}  // namespace dsv4::cuda
