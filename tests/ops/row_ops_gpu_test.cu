// The elementwise and row ops of backend/cuda/row_ops.h against their CpuBackend twins on fresh random
// inputs, at the test fixtures' shapes and DeepSeek-V4-Flash's. Outputs are poisoned with 0xff (NaN)
// first; a NaN anywhere fails. Ops whose every step is a correctly rounded f32 operation on the same
// operands are checked bit for bit; the others with the bound their comment derives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/act_quant_fp8.h"
#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/row_ops.h"
#include "core/dtypes.h"
#include "core/error.h"
#include "gpu_test_rng.h"

namespace dsv4::cuda {
namespace {

std::mt19937& rng() { return test::fresh_rng("row_ops_gpu_test"); }

CpuBackend& cpu() {
  static CpuBackend backend;
  return backend;
}

// bf16 values N(0,1)·2^e in groups of `group` elements, e per group from [emin, emax]; groups
// g ≡ 1 (mod 11) all zero, groups g ≡ 3 (mod 7) with one outlier of 3000× the group's magnitude.
std::vector<uint16_t> random_groups(int64_t n, int group, int emin, int emax) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> e(emin, emax);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (int64_t g = 0; g * group < n; ++g) {
    const float mag = g % 11 == 1 ? 0.f : std::ldexp(1.0f, e(rng()));
    const int64_t end = std::min<int64_t>(n, (g + 1) * group);
    for (int64_t i = g * group; i < end; ++i) v[size_t(i)] = dsv4::f32_to_bf16(nd(rng()) * mag);
    if (g % 7 == 3) v[size_t(g * group + g % (end - g * group))] = dsv4::f32_to_bf16(mag * 3000.f);
  }
  return v;
}

Tensor host_tensor(DType dtype, std::vector<int64_t> shape, const void* data) {
  return cpu().from_host(dtype, std::move(shape), data);
}

std::vector<uint16_t> bf16_contents(const Tensor& t) {
  std::vector<uint16_t> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data, t.nbytes());
  return v;
}

bool is_nan_bf16(uint16_t h) { return (h & 0x7fff) > 0x7f80; }
// bf16 bit patterns on a line where neighbours differ by one ulp (±0 both at 0).
int ordered_bf16(uint16_t h) { return (h & 0x8000) ? -int(h & 0x7fff) : int(h); }

struct Bf16Diff {
  size_t total = 0, differ = 0, nan = 0;
  int max_ulp = 0;
};

Bf16Diff compare_bf16(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  Bf16Diff d;
  d.total = want.size();
  for (size_t i = 0; i < want.size(); ++i) {
    if (is_nan_bf16(got[i])) { ++d.nan; continue; }
    if (got[i] == want[i]) continue;
    ++d.differ;
    d.max_ulp = std::max(d.max_ulp, std::abs(ordered_bf16(got[i]) - ordered_bf16(want[i])));
  }
  return d;
}

void print_diff(const char* what, const Bf16Diff& d) {
  std::printf("%s: %zu of %zu differ (max %d ulp), %zu NaN\n", what, d.differ, d.total, d.max_ulp, d.nan);
}

void expect_bit_exact(const char* what, const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  const Bf16Diff d = compare_bf16(got, want);
  print_diff(what, d);
  EXPECT_EQ(d.nan, 0u) << what;
  EXPECT_EQ(d.differ, 0u) << what;
}

// ---- embed ---------------------------------------------------------------------------------------

void check_embed(int64_t n, int dim, int copies) {
  const int vocab = 1000;
  const std::vector<uint16_t> table = random_groups(int64_t(vocab) * dim, dim, -10, 10);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& i : ids) i = id(rng());
  ids.front() = 0;
  ids.back() = vocab - 1;
  const std::vector<uint16_t> rows = bf16_contents(cpu().embed(dsv4::upload_i32(cpu(), ids), table.data(), dim));
  std::vector<uint16_t> want(static_cast<size_t>(n * copies * dim));
  for (int64_t i = 0; i < n; ++i)
    for (int c = 0; c < copies; ++c)
      std::memcpy(&want[size_t((i * copies + c) * dim)], &rows[size_t(i * dim)], size_t(dim) * 2);

  Stream stream;
  DeviceBuffer<int32_t> d_ids(ids.size());
  DeviceBuffer<uint16_t> d_table(table.size()), d_out(want.size());
  d_ids.upload(ids, stream.get());
  d_table.upload(table, stream.get());
  d_out.fill_bytes(0xff, stream.get());
  embed_rows(d_ids.get(), n, d_table.get(), dim, copies, d_out.get(), stream.get());
  DSV4_CUDA_CHECK_LAUNCH();
  char what[96];
  std::snprintf(what, sizeof what, "embed_rows n %lld dim %d copies %d", (long long)n, dim, copies);
  expect_bit_exact(what, d_out.download(stream.get()), want);
}

TEST(RowOpsEmbed, MatchesCpuBitExact) {
  check_embed(1, 128, 4);
  check_embed(37, 128, 4);
  check_embed(3, 4096, 4);
  check_embed(37, 4096, 1);
  check_embed(5, 100, 3);  // not a multiple of 8: the bf16-word path
}

// ---- rms_norm ------------------------------------------------------------------------------------

// The CPU sums the squares in double, the GPU in f32 (a few dozen roundings per row on positive terms):
// rs differs by ≲ 2e-6 relative, so y = bf16(w·(x·rs)) differs only where the exact value lies that
// close to a bf16 midpoint — at most 1 ulp, on about 2e-6 / 2^-8 ≈ 5e-4 of the elements at worst
// (typically ~1e-4). Bound: ≤ 1 ulp, and at most 4 + 0.5 % of the elements.
void check_rms_norm(int64_t rows, int n) {
  const std::vector<uint16_t> x = random_groups(rows * n, n, -30, 20);
  std::normal_distribution<float> wd(1.f, 0.5f);
  std::vector<uint16_t> w(static_cast<size_t>(n));
  for (auto& v : w) v = dsv4::f32_to_bf16(wd(rng()));
  const float eps = 1e-6f;
  const std::vector<uint16_t> want =
      bf16_contents(cpu().rms_norm(host_tensor(DType::BF16, {rows, n}, x.data()), w.data(), eps));

  Stream stream;
  DeviceBuffer<uint16_t> d_x(x.size()), d_w(w.size()), d_y(x.size());
  d_x.upload(x, stream.get());
  d_w.upload(w, stream.get());
  d_y.fill_bytes(0xff, stream.get());
  rms_norm(d_x.get(), d_w.get(), rows, n, eps, d_y.get(), stream.get());
  DSV4_CUDA_CHECK_LAUNCH();
  const Bf16Diff d = compare_bf16(d_y.download(stream.get()), want);
  char what[96];
  std::snprintf(what, sizeof what, "rms_norm %lld × %d", (long long)rows, n);
  print_diff(what, d);
  EXPECT_EQ(d.nan, 0u);
  EXPECT_LE(d.max_ulp, 1);
  EXPECT_LE(d.differ, 4 + d.total / 200);
}

TEST(RowOpsRmsNorm, MatchesCpu) {
  for (int64_t rows : {1, 3, 37})
    for (int n : {128, 512, 1024, 4096}) check_rms_norm(rows, n);  // 8 channels a load
  check_rms_norm(5, 100);  // a width that is no multiple of 8: one channel a load
}

// rms_norm with the FP8 codes of its rows made beside them (Fp8Rows): the same rows, and the codes,
// scales and (if asked) values that act_quant_fp8 makes of them afterwards, bit for bit. Every output
// poisoned first.
void check_rms_norm_quant(int64_t rows, int n, bool values) {
  const std::vector<uint16_t> x = random_groups(rows * n, n, -30, 20);
  std::normal_distribution<float> wd(1.f, 0.5f);
  std::vector<uint16_t> w(static_cast<size_t>(n));
  for (auto& v : w) v = dsv4::f32_to_bf16(wd(rng()));
  const float eps = 1e-6f;
  const size_t count = size_t(rows * n), blocks = count / 128;
  Stream stream;
  DeviceBuffer<uint16_t> d_x(count), d_w(w.size()), d_y(count), d_y2(count), d_v(count), d_v2(count);
  DeviceBuffer<uint8_t> d_q(count), d_q2(count);
  DeviceBuffer<float> d_s(blocks), d_s2(blocks);
  d_x.upload(x, stream.get());
  d_w.upload(w, stream.get());
  for (auto* b : {&d_y, &d_y2, &d_v, &d_v2}) b->fill_bytes(0xff, stream.get());
  for (auto* b : {&d_q, &d_q2}) b->fill_bytes(0xff, stream.get());
  for (auto* b : {&d_s, &d_s2}) b->fill_bytes(0xff, stream.get());
  rms_norm(d_x.get(), d_w.get(), rows, n, eps, d_y.get(), stream.get());
  act_quant_fp8(d_y.get(), int(rows), n, d_q.get(), d_s.get(), d_v.get(), stream.get());
  const Fp8Rows quant{d_q2.get(), d_s2.get(), values ? d_v2.get() : nullptr};
  ASSERT_TRUE(rms_norm_quant_fits(n, d_x.get(), d_w.get(), d_y2.get(), quant));
  rms_norm(d_x.get(), d_w.get(), rows, n, eps, d_y2.get(), stream.get(), quant);
  DSV4_CUDA_CHECK_LAUNCH();
  const std::string what = "rms_norm " + std::to_string(rows) + " × " + std::to_string(n) + (values ? " with values" : "");
  EXPECT_TRUE(d_y2.download(stream.get()) == d_y.download(stream.get())) << what << ": the rows";
  EXPECT_TRUE(d_q2.download(stream.get()) == d_q.download(stream.get())) << what << ": the codes";
  const std::vector<float> s = d_s.download(stream.get()), s2 = d_s2.download(stream.get());
  EXPECT_EQ(0, std::memcmp(s.data(), s2.data(), s.size() * 4)) << what << ": the scales";
  if (values) EXPECT_TRUE(d_v2.download(stream.get()) == d_v.download(stream.get())) << what << ": the values";
}

TEST(RowOpsRmsNorm, QuantisedBesideAsActQuant) {
  for (int64_t rows : {1, 2, 37, 64})
    for (int n : {256, 1024, 4096})
      for (bool values : {false, true}) check_rms_norm_quant(rows, n, values);
  // Widths that are no multiple of 256 take no codes: the op says so rather than write part of them.
  DeviceBuffer<uint16_t> x(128), w(128), y(128);
  DeviceBuffer<uint8_t> q(128);
  DeviceBuffer<float> s(1);
  const Fp8Rows quant{q.get(), s.get(), nullptr};
  EXPECT_FALSE(rms_norm_quant_fits(128, x.get(), w.get(), y.get(), quant));
  EXPECT_THROW(rms_norm(x.get(), w.get(), 1, 128, 1e-6f, y.get(), nullptr, quant), Error);
}

// ---- head_rms_norm -------------------------------------------------------------------------------

// The sum of the bf16-rounded squares is f32 on both sides, in another order (~1e-7 relative apart);
// the mean is then rounded to bf16, which absorbs that except when the sum lies within ~1e-7 of a
// bf16 midpoint (≈ 3e-5 of the heads). Such a head gets mean, var and r one bf16 ulp apart, its
// outputs up to 3 ulp apart (r moves by ≤ 2^-7 relative, the outputs' ulp is ≥ 2^-8 relative).
// Bound: ≤ 3 ulp, and at most 2 + 0.5 % of the heads differ at all.
void check_head_rms_norm(int64_t tokens, int heads, int head_dim) {
  const int64_t n_heads = tokens * heads;
  const std::vector<uint16_t> x = random_groups(n_heads * head_dim, head_dim, -30, 10);
  const float eps = 1e-6f;
  Tensor t = host_tensor(DType::BF16, {tokens, int64_t(heads) * head_dim}, x.data());
  cpu().head_rms_norm(t, head_dim, eps);
  const std::vector<uint16_t> want = bf16_contents(t);

  Stream stream;
  DeviceBuffer<uint16_t> d_x(x.size());
  d_x.upload(x, stream.get());
  head_rms_norm(d_x.get(), n_heads, head_dim, eps, stream.get());
  DSV4_CUDA_CHECK_LAUNCH();
  const std::vector<uint16_t> got = d_x.download(stream.get());
  const Bf16Diff d = compare_bf16(got, want);
  size_t heads_differ = 0;
  for (int64_t h = 0; h < n_heads; ++h)
    heads_differ += std::memcmp(&got[size_t(h * head_dim)], &want[size_t(h * head_dim)], size_t(head_dim) * 2) != 0;
  std::printf("head_rms_norm %lld tokens × %d heads × %d: %zu of %lld heads differ; ", (long long)tokens, heads,
              head_dim, heads_differ, (long long)n_heads);
  print_diff("elements", d);
  EXPECT_EQ(d.nan, 0u);
  EXPECT_LE(d.max_ulp, 3);
  EXPECT_LE(heads_differ, 2 + size_t(n_heads) / 200);
}

TEST(RowOpsHeadRmsNorm, MatchesCpu) {
  for (int64_t tokens : {1, 3, 37}) {
    check_head_rms_norm(tokens, 4, 512);   // fixture q heads
    check_head_rms_norm(tokens, 64, 512);  // Flash q heads
    check_head_rms_norm(tokens, 64, 128);  // Flash indexer heads
  }
}

// ---- rope ----------------------------------------------------------------------------------------

// Frequencies spanning the model's range: θ^(−2i/64) for θ = 10⁴ (plain layers) or 1.6·10⁵ with the
// low-frequency half divided by 16 (a YaRN-like table of the compressed layers). The op takes any table.
std::vector<float> rope_frequencies(bool yarn) {
  std::vector<float> f(32);
  const float theta = yarn ? 160000.f : 10000.f;
  for (int i = 0; i < 32; ++i) {
    f[size_t(i)] = 1.0f / std::pow(theta, float(2 * i) / 64.f);
    if (yarn && i >= 16) f[size_t(i)] /= 16.f;
  }
  return f;
}

// Positions of `rows` rows, anywhere in [0, 10^6].
std::vector<int32_t> random_positions(int64_t rows) {
  std::uniform_int_distribution<int32_t> pos(0, 1000000);
  std::vector<int32_t> positions(static_cast<size_t>(rows));
  for (auto& p : positions) p = pos(rng());
  return positions;
}

// Every step is the CPU's f32 operation on the same operands except cos/sin, double on both sides
// (CUDA's within 2 ulp of double, glibc's within 1): their f32 roundings differ only when the double
// results straddle an f32 midpoint, ~1e-8 of the values. So practically bit-exact; bound: ≤ 1 ulp, at
// most 4 + 0.1 % of the elements.
void check_rope(int64_t rows, int heads, int head_dim, bool yarn, bool inverse) {
  const int rope_dim = 64;
  RopeTable table;
  table.inv_freq = rope_frequencies(yarn);
  std::vector<int32_t> positions = random_positions(rows);
  positions[0] = 0;
  if (rows > 1) positions[1] = 1000000;
  const std::vector<uint16_t> x = random_groups(rows * heads * head_dim, head_dim, -10, 10);
  Tensor t = host_tensor(DType::BF16, {rows, int64_t(heads) * head_dim}, x.data());
  cpu().rope(t, head_dim, rope_dim, dsv4::upload_i32(cpu(), positions), table, inverse);
  const std::vector<uint16_t> want = bf16_contents(t);

  Stream stream;
  DeviceBuffer<uint16_t> d_x(x.size());
  DeviceBuffer<int32_t> d_pos(positions.size());
  DeviceBuffer<float> d_freq(table.inv_freq.size());
  d_x.upload(x, stream.get());
  d_pos.upload(positions, stream.get());
  d_freq.upload(table.inv_freq, stream.get());
  rope(d_x.get(), rows, heads, head_dim, rope_dim, d_pos.get(), d_freq.get(), inverse, stream.get());
  DSV4_CUDA_CHECK_LAUNCH();
  const Bf16Diff d = compare_bf16(d_x.download(stream.get()), want);
  char what[128];
  std::snprintf(what, sizeof what, "rope %lld × %d × %d %s%s", (long long)rows, heads, head_dim,
                yarn ? "yarn" : "plain", inverse ? " inverse" : "");
  print_diff(what, d);
  EXPECT_EQ(d.nan, 0u);
  EXPECT_LE(d.max_ulp, 1);
  EXPECT_LE(d.differ, 4 + d.total / 1000);
}

TEST(RowOpsRope, MatchesCpu) {
  for (int64_t rows : {1, 3, 37, 100})  // (up to 64 rows a row spreads over several blocks)
    for (bool inverse : {false, true}) {
      check_rope(rows, 4, 512, false, inverse);   // fixture q
      check_rope(rows, 64, 512, true, inverse);   // Flash q / attention output
      check_rope(rows, 64, 128, true, inverse);   // Flash indexer q
      check_rope(rows, 1, 512, false, inverse);   // a KV row
    }
}

// ---- norm_rope (bit-exact to the separate ops in sequence) --------------------------------------

// The fused op against rms_norm, rope and fp8_simulate run one after another on the GPU, each of which
// the tests above hold to its CPU twin: the same bits.
void check_norm_rope(int64_t rows, int heads, int head_dim, bool fp8_nope, int rope_dim = 64) {
  const int64_t n = rows * heads * head_dim;
  const std::vector<uint16_t> x = random_groups(n, head_dim, -30, 20);
  std::normal_distribution<float> wd(1.f, 0.5f);
  std::vector<uint16_t> w(static_cast<size_t>(head_dim));
  for (auto& v : w) v = dsv4::f32_to_bf16(wd(rng()));
  std::vector<int32_t> positions = random_positions(rows);
  const std::vector<float> freq = rope_frequencies(true);
  const float eps = 1e-6f;

  Stream stream;
  DeviceBuffer<uint16_t> d_x(x.size()), d_seq(x.size()), d_w(w.size());
  DeviceBuffer<int32_t> d_pos(positions.size());
  DeviceBuffer<float> d_freq(freq.size());
  d_x.upload(x, stream.get());
  d_w.upload(w, stream.get());
  d_pos.upload(positions, stream.get());
  d_freq.upload(freq, stream.get());
  const uint16_t* weight = d_w.get();
  d_seq.fill_bytes(0xff, stream.get());
  rms_norm(d_x.get(), weight, rows * heads, head_dim, eps, d_seq.get(), stream.get());
  rope(d_seq.get(), rows, heads, head_dim, rope_dim, d_pos.get(), d_freq.get(), false, stream.get());
  if (fp8_nope) fp8_simulate(d_seq.get(), rows * heads, head_dim, head_dim - rope_dim, stream.get());
  ASSERT_TRUE(norm_rope_fits(head_dim, rope_dim, d_x.get(), weight, fp8_nope));
  norm_rope(d_x.get(), rows, heads, head_dim, weight, eps, rope_dim, d_pos.get(), d_freq.get(), fp8_nope,
            stream.get());
  DSV4_CUDA_CHECK_LAUNCH();
  char what[128];
  std::snprintf(what, sizeof what, "norm_rope %lld × %d × %d%s", (long long)rows, heads, head_dim,
                fp8_nope ? ", fp8 nope" : "");
  expect_bit_exact(what, d_x.download(stream.get()), d_seq.download(stream.get()));
}

TEST(RowOpsNormRope, SameBitsAsTheOpsInSequence) {
  for (int64_t rows : {1, 3, 37, 300}) {
    check_norm_rope(rows, 1, 512, true);   // KV row, compressed entries
    check_norm_rope(rows, 1, 128, false);  // indexer keys (the Hadamard follows)
    check_norm_rope(rows, 1, 128, true);   // a 128-wide KV row
    check_norm_rope(rows, 4, 128, false);  // several heads a row
    check_norm_rope(rows, 2, 72, false, 16);  // a 64-channel piece of both parts, a piece cut short
    check_norm_rope(rows, 1, 200, true, 8);   // fp8 blocks, then a piece of four rotated pairs
  }
}

// head_norm_rope against head_rms_norm then rope on the GPU (each held to its CPU twin above).
void check_head_norm_rope(int64_t rows, int heads, int head_dim) {
  const int rope_dim = 64;
  const std::vector<uint16_t> x = random_groups(rows * heads * head_dim, head_dim, -30, 20);
  std::vector<int32_t> positions = random_positions(rows);
  const std::vector<float> freq = rope_frequencies(true);
  const float eps = 1e-6f;
  Stream stream;
  DeviceBuffer<uint16_t> d_x(x.size()), d_seq(x.size());
  DeviceBuffer<int32_t> d_pos(positions.size());
  DeviceBuffer<float> d_freq(freq.size());
  d_x.upload(x, stream.get());
  d_seq.upload(x, stream.get());
  d_pos.upload(positions, stream.get());
  d_freq.upload(freq, stream.get());
  head_rms_norm(d_seq.get(), rows * heads, head_dim, eps, stream.get());
  rope(d_seq.get(), rows, heads, head_dim, rope_dim, d_pos.get(), d_freq.get(), false, stream.get());
  head_norm_rope(d_x.get(), rows, heads, head_dim, eps, rope_dim, d_pos.get(), d_freq.get(), stream.get());
  DSV4_CUDA_CHECK_LAUNCH();
  char what[128];
  std::snprintf(what, sizeof what, "head_norm_rope %lld × %d × %d", (long long)rows, heads, head_dim);
  expect_bit_exact(what, d_x.download(stream.get()), d_seq.download(stream.get()));
}

TEST(RowOpsHeadNormRope, SameBitsAsTheOpsInSequence) {
  for (int64_t rows : {1, 5, 16, 64}) {
    check_head_norm_rope(rows, 64, 512);  // Flash q
    check_head_norm_rope(rows, 4, 512);   // fixture q (a block's heads beyond the row's)
    check_head_norm_rope(rows, 13, 128);  // heads not a multiple of the block's 8
    check_head_norm_rope(rows, 3, 80);    // a head not a multiple of the warp's 32 channels
  }
}

// ---- fp8_simulate and hadamard_fp4_simulate (bit-exact) ------------------------------------------

void check_fp8_simulate(int64_t rows, int row_width, int channels) {
  // Blocks of 64 from 2^-30 (under the 1e-4 amax floor) to 2^14, zero blocks, outliers that push the
  // rest of their block into e4m3 subnormals.
  const std::vector<uint16_t> x = random_groups(rows * row_width, 64, -30, 14);
  Tensor t = host_tensor(DType::BF16, {rows, row_width}, x.data());
  cpu().fp8_simulate(t, row_width, channels);

  Stream stream;
  DeviceBuffer<uint16_t> d_x(x.size());
  d_x.upload(x, stream.get());
  fp8_simulate(d_x.get(), rows, row_width, channels, stream.get());
  DSV4_CUDA_CHECK_LAUNCH();
  char what[96];
  std::snprintf(what, sizeof what, "fp8_simulate %lld × %d (first %d)", (long long)rows, row_width, channels);
  expect_bit_exact(what, d_x.download(stream.get()), bf16_contents(t));
}

TEST(RowOpsFp8Simulate, MatchesCpuBitExact) {
  for (int64_t rows : {1, 3, 37, 37 * 64}) {
    check_fp8_simulate(rows, 512, 448);  // KV nope channels
    check_fp8_simulate(rows, 128, 64);   // a 128-wide row with 64 rope channels
  }
  check_fp8_simulate(5, 512, 0);
}

void check_hadamard_fp4(int64_t vectors) {
  const std::vector<uint16_t> x = random_groups(vectors * 128, 128, -30, 14);
  Tensor t = host_tensor(DType::BF16, {vectors, 128}, x.data());
  cpu().hadamard_fp4_simulate(t, 128);

  Stream stream;
  DeviceBuffer<uint16_t> d_x(x.size());
  d_x.upload(x, stream.get());
  hadamard_fp4_simulate(d_x.get(), vectors, stream.get());
  DSV4_CUDA_CHECK_LAUNCH();
  char what[64];
  std::snprintf(what, sizeof what, "hadamard_fp4_simulate %lld × 128", (long long)vectors);
  expect_bit_exact(what, d_x.download(stream.get()), bf16_contents(t));
}

TEST(RowOpsHadamardFp4, MatchesCpuBitExact) {
  for (int64_t vectors : {1, 3, 4 * 37, 64, 64 * 37}) check_hadamard_fp4(vectors);
}

// ---- add, scale, f32 → bf16 (bit-exact) ----------------------------------------------------------

void check_add_scale(int64_t n) {
  std::vector<uint16_t> a = random_groups(n, 64, -30, 30), b = random_groups(n, 64, -30, 30);
  for (int64_t i = 0; i < n; i += 17) b[size_t(i)] = a[size_t(i)] ^ 0x8000;  // exact cancellation
  for (int64_t i = 5; i < n; i += 101) a[size_t(i)] = b[size_t(i)] = 0x7f7f;  // overflow to +inf
  const Tensor ta = host_tensor(DType::BF16, {n}, a.data()), tb = host_tensor(DType::BF16, {n}, b.data());

  Stream stream;
  DeviceBuffer<uint16_t> d_a(a.size()), d_b(b.size()), d_out(a.size());
  d_a.upload(a, stream.get());
  d_b.upload(b, stream.get());
  d_out.fill_bytes(0xff, stream.get());
  add_bf16(d_a.get(), d_b.get(), n, d_out.get(), stream.get());
  DSV4_CUDA_CHECK_LAUNCH();
  char what[64];
  std::snprintf(what, sizeof what, "add_bf16 n %lld", (long long)n);
  expect_bit_exact(what, d_out.download(stream.get()), bf16_contents(cpu().add(ta, tb)));
  for (float s : {float(1.0 / std::sqrt(128.0)), 3.0f, -1e-3f, 0.0f}) {
    d_out.fill_bytes(0xff, stream.get());
    scale_bf16(d_a.get(), s, n, d_out.get(), stream.get());
    DSV4_CUDA_CHECK_LAUNCH();
    std::snprintf(what, sizeof what, "scale_bf16 n %lld s %g", (long long)n, s);
    expect_bit_exact(what, d_out.download(stream.get()), bf16_contents(cpu().scale(ta, s)));
  }
}

void check_f32_to_bf16(int64_t n) {
  // Random finite bit patterns (all exponents, subnormals included), exact ties, values rounding to inf.
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = bits(rng());
    if ((u & 0x7f800000u) == 0x7f800000u) u &= 0xbfffffffu;  // no inf / NaN inputs
    if (i % 13 == 0) u = (u & 0xffff0000u) | 0x8000u;        // a tie: to even
    if (i % 97 == 0) u = 0x7f7fffffu | (u & 0x80000000u);    // ±FLT_MAX rounds to ±inf
    x[size_t(i)] = dsv4::bits_to_f32(u);
  }
  Stream stream;
  DeviceBuffer<float> d_x(x.size());
  DeviceBuffer<uint16_t> d_out(x.size());
  d_x.upload(x, stream.get());
  d_out.fill_bytes(0xff, stream.get());
  f32_to_bf16(d_x.get(), n, d_out.get(), stream.get());
  DSV4_CUDA_CHECK_LAUNCH();
  char what[64];
  std::snprintf(what, sizeof what, "f32_to_bf16 n %lld", (long long)n);
  expect_bit_exact(what, d_out.download(stream.get()),
                   bf16_contents(cpu().to_bf16(host_tensor(DType::F32, {n}, x.data()))));
}

TEST(RowOpsElementwise, MatchesCpuBitExact) {
  for (int64_t n : {1, 4096 * 3, 4 * 4096 * 37}) {
    check_add_scale(n);
    check_f32_to_bf16(n);
  }
  check_f32_to_bf16(int64_t(65536) * 256 + 12345);  // past the 65536 blocks: the grid-stride loop
}

// ---- swiglu --------------------------------------------------------------------------------------

// The CPU's SwiGLU: cpu_moe.cpp run_expert (not a CpuBackend method of its own), expression for
// expression.
std::vector<uint16_t> swiglu_reference(const std::vector<uint16_t>& gate, const std::vector<uint16_t>& up,
                                       int64_t rows, int inter, float limit, const float* row_weights) {
  std::vector<uint16_t> h(gate.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inter; ++i) {
      float gv = bf16_to_f32(gate[size_t(r * inter + i)]);
      float uv = bf16_to_f32(up[size_t(r * inter + i)]);
      if (limit > 0) {
        uv = std::clamp(uv, -limit, limit);
        gv = std::min(gv, limit);
      }
      float a = gv / (1.0f + std::exp(-gv)) * uv;
      if (row_weights) a = row_weights[r] * a;
      h[size_t(r * inter + i)] = dsv4::f32_to_bf16(a);
    }
  return h;
}

// Every step is the CPU's except exp (CUDA's expf within 2 ulp of glibc's), which moves a ~1e-7
// relative amount: a bf16 output differs only on a near-midpoint, ~1e-5 of the elements, by 1 ulp.
// Bound: ≤ 1 ulp, at most 4 + 0.1 % of the elements.
void check_swiglu(int64_t rows, int inter, float limit, bool weighted) {
  std::normal_distribution<float> nd(0.f, 6.f);  // ~10 % beyond ±10
  std::vector<uint16_t> gate(static_cast<size_t>(rows * inter)), up(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    gate[i] = dsv4::f32_to_bf16(nd(rng()));
    up[i] = dsv4::f32_to_bf16(nd(rng()));
  }
  gate[0] = dsv4::f32_to_bf16(-200.f);  // exp(200) overflows: silu → −0
  if (gate.size() > 1) gate[1] = dsv4::f32_to_bf16(200.f);
  std::uniform_real_distribution<float> wd(0.f, 1.f);
  std::vector<float> w(static_cast<size_t>(rows));
  for (auto& v : w) v = wd(rng());
  const std::vector<uint16_t> want = swiglu_reference(gate, up, rows, inter, limit, weighted ? w.data() : nullptr);

  Stream stream;
  DeviceBuffer<uint16_t> d_gate(gate.size()), d_up(up.size()), d_out(gate.size());
  DeviceBuffer<float> d_w(w.size());
  d_gate.upload(gate, stream.get());
  d_up.upload(up, stream.get());
  d_w.upload(w, stream.get());
  d_out.fill_bytes(0xff, stream.get());
  swiglu(d_gate.get(), d_up.get(), rows, inter, limit, weighted ? d_w.get() : nullptr, d_out.get(), stream.get());
  DSV4_CUDA_CHECK_LAUNCH();
  const Bf16Diff d = compare_bf16(d_out.download(stream.get()), want);
  char what[96];
  std::snprintf(what, sizeof what, "swiglu %lld × %d limit %g%s", (long long)rows, inter, limit,
                weighted ? " weighted" : "");
  print_diff(what, d);
  EXPECT_EQ(d.nan, 0u);
  EXPECT_LE(d.max_ulp, 1);
  EXPECT_LE(d.differ, 4 + d.total / 1000);
}

TEST(RowOpsSwiglu, MatchesCpu) {
  for (int64_t rows : {1, 3, 37})
    for (int inter : {128, 2048}) {
      check_swiglu(rows, inter, 10.f, false);
      check_swiglu(rows, inter, 10.f, true);
      check_swiglu(rows, inter, 0.f, true);  // no clamp
    }
}

// The activation simulation from a source buffer: the bits of the in-place form (which the MoE tests
// hold to the CPU's FP8 numerics), the source unchanged.
void check_fp8_simulate_activations(int64_t rows, int cols) {
  const std::vector<uint16_t> x = random_groups(rows * cols, 128, -30, 14);
  Stream stream;
  DeviceBuffer<uint16_t> d_src(x.size()), d_out(x.size()), d_in_place(x.size());
  d_src.upload(x, stream.get());
  d_in_place.upload(x, stream.get());
  d_out.fill_bytes(0xff, stream.get());  // poison
  fp8_simulate_activations(d_in_place.get(), rows, cols, stream.get());
  fp8_simulate_activations(d_src.get(), d_out.get(), rows, cols, stream.get());
  DSV4_CUDA_CHECK_LAUNCH();
  char what[96];
  std::snprintf(what, sizeof what, "fp8_simulate_activations %lld × %d from a source", (long long)rows, cols);
  expect_bit_exact(what, d_out.download(stream.get()), d_in_place.download(stream.get()));
  expect_bit_exact("the source of fp8_simulate_activations", d_src.download(stream.get()), x);
}

TEST(RowOpsFp8SimulateActivations, FromASourceAsInPlace) {
  for (int64_t rows : {1, 7, 300}) {
    check_fp8_simulate_activations(rows, 4096);
    check_fp8_simulate_activations(rows, 256);
  }
}

// ---- small cases for compute-sanitizer -----------------------------------------------------------

TEST(RowOpsSanitizer, Small) {
  check_rms_norm_quant(3, 256, true);
  check_embed(3, 128, 4);
  check_embed(2, 100, 2);
  check_rms_norm(3, 128);
  check_head_rms_norm(2, 4, 128);
  check_rope(3, 4, 128, false, false);
  check_rope(2, 1, 512, true, true);
  check_norm_rope(3, 4, 128, false);
  check_norm_rope(2, 1, 512, true);
  check_head_norm_rope(2, 13, 128);
  check_fp8_simulate(3, 512, 448);
  check_fp8_simulate_activations(2, 256);
  check_hadamard_fp4(3);
  check_add_scale(1000);
  check_f32_to_bf16(1000);
  check_swiglu(3, 128, 10.f, true);
  check_swiglu(2, 64, 0.f, false);
}

}  // namespace
}  // namespace dsv4::cuda
