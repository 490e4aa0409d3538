// MoE routing (backend/cuda/router.h) and the KV compressor state machine (backend/cuda/compressor.h)
// against CpuBackend::route and CpuBackend::compressor_update / compressor_state_init.
//
// Routing: the GPU gets the very f32 logits the CPU route computes (CpuBackend::linear_f32), so the
// ids are exact except where two selection scores are within a few f32 ulps (exp / log1p may differ
// by an ulp between glibc and CUDA): such flips are accepted and counted. Weights within 1e-6
// relative on rows without a flip.
// Compressor: the same f32 operations in the same order; only exp may differ by an ulp, so pooled
// rows must agree within 1e-5 · (|ref| + max|a|) (a convex combination of a; the bit-exact share is
// printed) and the state (copies and g + ape) bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/compressor.h"
#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/router.h"
#include "core/dtypes.h"
#include "gpu_test_rng.h"

namespace dsv4::cuda {
namespace {

std::mt19937& rng() { return test::fresh_rng("router_compressor_gpu_test"); }

// ---------------------------------------------------------------------------------------------
// Routing.

enum class RouteMode { Learned, LearnedNoBias, Hash };

void check_route(RouteMode mode, int64_t T, int E, int k, int D) {
  CpuBackend cpu;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> x(size_t(T) * D), gate(size_t(E) * D);
  for (auto& v : x) v = f32_to_bf16(nd(rng()));
  for (auto& v : gate) v = f32_to_bf16(nd(rng()) * 0.15f);
  // Exact ties: some experts get identical gate rows (identical logits) and, with a bias, equal bias.
  for (int e = 1; e < E; e += 5) std::copy_n(gate.begin() + size_t(e - 1) * D, D, gate.begin() + size_t(e) * D);
  std::vector<float> bias(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) bias[size_t(e)] = (e % 5 == 0 && e + 1 < E) ? 0.f : nd(rng()) * 0.3f;
  for (int e = 1; e < E; e += 5) bias[size_t(e)] = bias[size_t(e - 1)];
  const int vocab = 1000;
  std::vector<int32_t> table(size_t(vocab) * k), token_ids(static_cast<size_t>(T));
  for (int v = 0; v < vocab; ++v) {
    std::vector<int32_t> perm(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) perm[size_t(e)] = e;
    std::shuffle(perm.begin(), perm.end(), rng());
    std::copy_n(perm.begin(), k, table.begin() + size_t(v) * k);
  }
  for (auto& t : token_ids) t = int32_t(rng()() % vocab);

  MoeWeights mw;
  mw.gate = gate.data();
  mw.bias = mode == RouteMode::Learned ? bias.data() : nullptr;
  mw.hash_table = mode == RouteMode::Hash ? table.data() : nullptr;
  mw.experts.resize(size_t(E));
  Tensor xt = cpu.from_host(DType::BF16, {T, D}, x.data());
  dsv4::Routing want = cpu.route(xt, mw, dsv4::upload_i32(cpu, token_ids), k, 1.5f);
  Tensor logits = cpu.linear_f32(xt, gate.data(), E, D);

  // The CPU's selection scores, to judge flips.
  std::vector<float> sel(size_t(T) * E);
  for (int64_t i = 0; i < T * E; ++i) {
    const float z = logits.ptr<float>()[i];
    const float a = std::sqrt(z > 20.0f ? z : std::log1p(std::exp(z)));
    sel[size_t(i)] = mode == RouteMode::Learned ? a + bias[size_t(i % E)] : a;
  }

  Stream stream;
  DeviceBuffer<float> d_logits(size_t(T) * E), d_bias(static_cast<size_t>(E)), d_w(size_t(T) * k);
  DeviceBuffer<int32_t> d_table(table.size()), d_tok(token_ids.size()), d_ids(size_t(T) * k);
  d_logits.upload(logits.ptr<float>(), size_t(T) * E, stream.get());
  d_bias.upload(bias, stream.get());
  d_table.upload(table, stream.get());
  d_tok.upload(token_ids, stream.get());
  d_ids.fill_bytes(0xff, stream.get());
  d_w.fill_bytes(0xff, stream.get());
  route_topk(d_logits.get(), mode == RouteMode::Learned ? d_bias.get() : nullptr,
             mode == RouteMode::Hash ? d_table.get() : nullptr, d_tok.get(), T, E, k, 1.5f, d_ids.get(), d_w.get(),
             stream.get());
  const std::vector<int32_t> ids = d_ids.download(stream.get());
  const std::vector<float> w = d_w.download(stream.get());

  size_t flips = 0, bad_ids = 0, bad_w = 0, nan = 0;
  double worst_rel = 0;
  for (int64_t t = 0; t < T; ++t) {
    bool row_flip = false;
    for (int i = 0; i < k; ++i) {
      const size_t at = size_t(t) * k + i;
      const int32_t g = ids[at], c = want.ids.ptr<int32_t>()[at];
      if (g == c) continue;
      const bool in_range = g >= 0 && g < E;
      const float sg = in_range ? sel[size_t(t) * E + g] : NAN, sc = sel[size_t(t) * E + c];
      // A near-tie: scores within 4 f32 ulps of the larger. Experts with identical logits and bias
      // are an exact tie on both sides and must go to the lower id: no excuse there.
      const bool identical = in_range && logits.ptr<float>()[t * E + g] == logits.ptr<float>()[t * E + c] &&
                             (mode != RouteMode::Learned || bias[size_t(g)] == bias[size_t(c)]);
      if (in_range && !identical &&
          std::fabs(sg - sc) <= 4 * std::ldexp(1.f, std::ilogb(std::max(std::fabs(sg), std::fabs(sc)) + 1e-30f) - 23))
        ++flips, row_flip = true;
      else
        ++bad_ids;
    }
    if (row_flip) continue;
    for (int i = 0; i < k; ++i) {
      const size_t at = size_t(t) * k + i;
      const float g = w[at], c = want.weights.ptr<float>()[at];
      if (std::isnan(g)) { ++nan; continue; }
      const double rel = std::fabs(double(g) - c) / std::max(1e-30, std::fabs(double(c)));
      worst_rel = std::max(worst_rel, rel);
      bad_w += rel > 1e-6;
    }
  }
  std::printf("route %s T %lld E %d k %d: %zu near-tie flips, %zu wrong ids, worst weight rel %.2e, %zu NaN\n",
              mode == RouteMode::Hash ? "hash" : mode == RouteMode::Learned ? "learned+bias" : "learned", (long long)T, E, k,
              flips, bad_ids, worst_rel, nan);
  EXPECT_EQ(bad_ids, 0u);
  EXPECT_EQ(bad_w, 0u);
  EXPECT_EQ(nan, 0u);
}

TEST(RouteTopk, FixtureShapes) {
  for (auto mode : {RouteMode::Learned, RouteMode::LearnedNoBias, RouteMode::Hash})
    for (int64_t T : {1, 4, 33, 300}) check_route(mode, T, 8, 6, 128);
}

TEST(RouteTopk, FlashShapes) {
  for (auto mode : {RouteMode::Learned, RouteMode::Hash})
    for (int64_t T : {1, 2, 64}) check_route(mode, T, 256, 6, 4096);
  check_route(RouteMode::Learned, 33, 200, 8, 256);  // E not a multiple of 32
}

// ---------------------------------------------------------------------------------------------
// Compressor.

// Feeds one sequence in chunks of the given sizes through both backends and compares each chunk's
// pooled rows and the final state.
void check_compressor(int ratio, int d, const std::vector<int64_t>& chunks) {
  CpuBackend cpu;
  const int coff = ratio == 4 ? 2 : 1, width = coff * d;
  int64_t total = 0;
  for (auto n : chunks) total += n;
  std::normal_distribution<float> nd(0.f, 1.f);
  // a, g of all tokens with a few extra rows before, so row0 is not 0.
  const int64_t lead = 3;
  std::vector<float> a(size_t(lead + total) * width), g(a.size()), ape(size_t(ratio) * width);
  for (auto& v : a) v = nd(rng());
  for (auto& v : g) v = nd(rng()) * 2.f;
  for (auto& v : ape) v = nd(rng()) * 0.5f;
  float max_a = 0;
  for (float v : a) max_a = std::max(max_a, std::fabs(v));
  Tensor at = cpu.from_host(DType::F32, {lead + total, width}, a.data());
  Tensor gt = cpu.from_host(DType::F32, {lead + total, width}, g.data());
  CompressorState state;
  cpu.compressor_state_init(state, ratio, d);

  Stream stream;
  const size_t state_count = size_t(coff) * ratio * width;
  DeviceBuffer<float> d_a(a.size()), d_g(g.size()), d_ape(ape.size()), d_kv(state_count), d_sc(state_count);
  DeviceBuffer<float> d_out(size_t(total / ratio + 2) * d);
  d_a.upload(a, stream.get());
  d_g.upload(g, stream.get());
  d_ape.upload(ape, stream.get());
  d_kv.fill_bytes(0xff, stream.get());
  d_sc.fill_bytes(0xff, stream.get());
  compressor_state_init(d_kv.get(), d_sc.get(), ratio, d, stream.get());

  size_t outputs = 0, exact = 0, bad = 0, nan = 0;
  double worst = 0;
  int64_t pos = 0;
  for (int64_t n : chunks) {
    Tensor want = cpu.compressor_update(at, gt, lead + pos, n, pos, ape.data(), ratio, d, state);
    d_out.fill_bytes(0xff, stream.get());
    compressor_update(d_a.get(), d_g.get(), lead + pos, n, pos, d_ape.get(), ratio, d, d_kv.get(), d_sc.get(),
                      d_out.get(), stream.get());
    const std::vector<float> got = d_out.download(stream.get());
    const int64_t emitted = want.rows();
    for (int64_t i = 0; i < emitted * d; ++i) {
      const float gv = got[size_t(i)], wv = want.ptr<float>()[i];
      ++outputs;
      if (std::isnan(gv)) { ++nan; continue; }
      const double diff = std::fabs(double(gv) - wv);
      exact += diff == 0;
      worst = std::max(worst, diff / (std::fabs(wv) + max_a));
      bad += diff > 1e-5 * (std::fabs(wv) + max_a);
    }
    // Rows past the emitted ones stay poisoned (nothing written beyond `emitted`).
    for (int64_t i = emitted * d; i < int64_t(got.size()); ++i) {
      uint32_t u;
      std::memcpy(&u, &got[size_t(i)], 4);
      EXPECT_EQ(u, 0xffffffffu) << "write past the emitted rows at " << i;
      if (u != 0xffffffffu) break;
    }
    pos += n;
  }
  const std::vector<float> kv = d_kv.download(stream.get()), sc = d_sc.download(stream.get());
  const bool kv_same = std::memcmp(kv.data(), state.kv.ptr<float>(), state_count * 4) == 0;
  const bool sc_same = std::memcmp(sc.data(), state.score.ptr<float>(), state_count * 4) == 0;
  std::printf("compressor ratio %d d %d, %lld tokens in %zu chunks: %zu outputs, %.2f%% bit-exact, worst %.2e, "
              "%zu NaN, state %s\n",
              ratio, d, (long long)total, chunks.size(), outputs, outputs ? 100.0 * exact / outputs : 100.0, worst, nan,
              kv_same && sc_same ? "bit-exact" : "DIFFERS");
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(nan, 0u);
  EXPECT_TRUE(kv_same);
  EXPECT_TRUE(sc_same);
}

TEST(Compressor, OverlappingRatio4) {
  for (int d : {128, 512}) {
    check_compressor(4, d, {1, 4, 33, 300});
    check_compressor(4, d, std::vector<int64_t>(40, 1));  // decode token by token
    check_compressor(4, d, {3, 1, 2, 7});
  }
}

// Chunks past 4·ratio tokens pool every completed entry in parallel and walk only the last two
// windows for the state (compressor.cu): chunks starting at every phase, then decode after them.
TEST(Compressor, LongChunksPoolInParallel) {
  check_compressor(4, 512, {2, 1000, 17, 333, 1, 1});
  check_compressor(4, 128, {3, 64, 65, 1});
  check_compressor(128, 512, {200, 700, 1300, 1, 1});
  check_compressor(128, 512, {1024, 600, 513});
}

TEST(Compressor, Ratio128) {
  check_compressor(128, 512, {1, 4, 33, 300});
  check_compressor(128, 512, {127, 1, 128, 5});
  check_compressor(128, 64, std::vector<int64_t>(130, 1));
}

TEST(RouterCompressorSanitizer, Small) {
  check_route(RouteMode::Learned, 5, 8, 6, 128);
  check_route(RouteMode::Hash, 3, 40, 6, 128);
  check_compressor(4, 64, {5, 3});
  check_compressor(128, 32, {130});
  check_compressor(4, 64, {3, 40, 1});
  check_compressor(128, 32, {600, 2});
}

}  // namespace
}  // namespace dsv4::cuda
