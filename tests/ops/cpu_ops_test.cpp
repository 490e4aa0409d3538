// Properties of the CPU reference ops on fresh random inputs, checked against plain
// double-precision formulas (the golden tests check them against the reference itself).
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/kv_cache_layout.h"

namespace dsv4 {
namespace {

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(d(rng));
  return v;
}

TEST(CpuOps, Fp8SimulationIsLosslessInKvEntries) {
  std::mt19937 rng(1);
  CpuBackend be;
  for (int rep = 0; rep < 50; ++rep) {
    auto v = random_bf16(512, rng, std::exp2(float(rep % 20) - 10));
    Tensor x = be.from_host(DType::BF16, {1, 512}, v.data());
    be.fp8_simulate(x, 512, 448);
    EntryPool pool;
    pool.kind = EntryKind::KV;
    be.grow_pool(pool, 1);
    be.write_entries(x, {0}, {5}, pool);
    float back[512];
    kv_layout::decode_kv_entry_at(pool.storage.ptr<uint8_t>(), 5, back);
    for (int i = 0; i < 512; ++i) ASSERT_EQ(back[i], bf16_to_f32(x.ptr<uint16_t>()[i])) << i;
  }
}

TEST(CpuOps, HadamardIsOrthonormal) {
  // H·H/128 = I: applying it twice returns the input up to bf16 rounding.
  std::mt19937 rng(2);
  auto v = random_bf16(128, rng);
  auto w = v;
  cpu::hadamard128(w.data());
  double n0 = 0, n1 = 0;
  for (int i = 0; i < 128; ++i) n0 += std::pow(bf16_to_f32(v[i]), 2), n1 += std::pow(bf16_to_f32(w[i]), 2);
  EXPECT_NEAR(n1 / n0, 1.0, 1e-2);
  cpu::hadamard128(w.data());
  for (int i = 0; i < 128; ++i) EXPECT_NEAR(bf16_to_f32(w[i]), bf16_to_f32(v[i]), 0.02 + 0.01 * std::fabs(bf16_to_f32(v[i])));
}

TEST(CpuOps, SparseAttentionMatchesSoftmaxWithSink) {
  std::mt19937 rng(3);
  CpuBackend be;
  const int H = 4, d = 512, n_entries = 200, list_len = 190;
  EntryPool pool;
  pool.kind = EntryKind::KV;
  be.grow_pool(pool, (n_entries + 63) / 64);
  auto kv = random_bf16(size_t(n_entries) * d, rng);
  Tensor kvt = be.from_host(DType::BF16, {n_entries, d}, kv.data());
  be.fp8_simulate(kvt, d, 448);
  std::vector<int64_t> rows(n_entries), ids(n_entries);
  std::iota(rows.begin(), rows.end(), 0);
  std::iota(ids.begin(), ids.end(), 0);
  be.write_entries(kvt, rows, ids, pool);
  const int T = 3;
  auto q = random_bf16(size_t(T) * H * d, rng, 0.05f);
  Tensor qt = be.from_host(DType::BF16, {T, H, d}, q.data());
  std::vector<int64_t> lists(size_t(T) * list_len, -1);
  std::uniform_int_distribution<int> pick(0, n_entries - 1);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < list_len - 7 * t; ++i) lists[size_t(t * list_len + i)] = pick(rng);
  float sink[H] = {0.5f, -1.0f, 2.0f, 0.0f};
  const float scale = 1.0f / std::sqrt(512.0f);
  Tensor o = be.sparse_attention(qt, H, d, pool, lists, list_len, sink, scale);
  double err = 0, ref_norm = 0;
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      std::vector<double> s, acc(d, 0);
      std::vector<const uint16_t*> keys;
      for (int i = 0; i < list_len; ++i) {
        int64_t e = lists[size_t(t * list_len + i)];
        if (e < 0) continue;
        const uint16_t* k = kvt.ptr<uint16_t>() + e * d;
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(bf16_to_f32(q[size_t((t * H + h) * d + c)])) * bf16_to_f32(k[c]);
        s.push_back(dot * scale);
        keys.push_back(k);
      }
      double m = *std::max_element(s.begin(), s.end()), z = std::exp(sink[h] - m);
      for (double x : s) z += std::exp(x - m);
      for (size_t i = 0; i < s.size(); ++i)
        for (int c = 0; c < d; ++c) acc[size_t(c)] += std::exp(s[i] - m) / z * bf16_to_f32(keys[i][c]);
      for (int c = 0; c < d; ++c) {
        double got = bf16_to_f32(o.ptr<uint16_t>()[(t * H + h) * d + c]);
        err += (got - acc[size_t(c)]) * (got - acc[size_t(c)]);
        ref_norm += acc[size_t(c)] * acc[size_t(c)];
      }
    }
  EXPECT_LT(std::sqrt(err / ref_norm), 1e-2);  // bf16 probabilities and output
}

TEST(CpuOps, IndexerTopkOrderAndTies) {
  CpuBackend be;
  const int H = 2, T = 1, n = 10, k = 4;
  EntryPool pool;
  pool.kind = EntryKind::INDEX_KEY;
  be.grow_pool(pool, 1);
  // Keys: e_j · (j mod 3) along channel 0, so entries 0, 3, 6, 9 score 0 (ties) and 2, 5, 8 the most.
  std::vector<uint16_t> keys(size_t(n) * 128, 0);
  for (int j = 0; j < n; ++j) keys[size_t(j) * 128] = f32_to_bf16(float(j % 3));
  Tensor kt = be.from_host(DType::BF16, {n, 128}, keys.data());
  std::vector<int64_t> rows(n), ids(n);
  std::iota(rows.begin(), rows.end(), 0);
  std::iota(ids.begin(), ids.end(), 0);
  be.write_entries(kt, rows, ids, pool);
  std::vector<uint16_t> q(size_t(H) * 128, 0), w(H, f32_to_bf16(1.0f));
  q[0] = q[128] = f32_to_bf16(1.0f);
  Tensor qt = be.from_host(DType::BF16, {T, H, 128}, q.data()), wt = be.from_host(DType::BF16, {T, H}, w.data());
  Tensor top = be.indexer_topk(qt, wt, H, pool, ids, {n}, n, k);
  std::vector<int32_t> got(k);
  be.to_host(top, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{2, 5, 8, 1}));  // highest first; ties to the lower index
  top = be.indexer_topk(qt, wt, H, pool, ids, {2}, n, k);  // fewer keys than k: −1 fill
  be.to_host(top, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{1, 0, -1, -1}));
}

TEST(CpuOps, CompressorChunkingIsInvariant) {
  // The state machine gives the same entries whether tokens come one by one or all at once.
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  CpuBackend be;
  for (int ratio : {4, 128}) {
    const int d = 64, coff = ratio == 4 ? 2 : 1, width = coff * d, T = 300;
    std::vector<float> a(size_t(T) * width), g(size_t(T) * width), ape(size_t(ratio) * width);
    for (auto* v : {&a, &g, &ape})
      for (auto& x : *v) x = nd(rng);
    Tensor at = be.from_host(DType::F32, {T, width}, a.data()), gt = be.from_host(DType::F32, {T, width}, g.data());
    CompressorState whole, single;
    be.compressor_state_init(whole, ratio, d);
    be.compressor_state_init(single, ratio, d);
    Tensor all = be.compressor_update(at, gt, 0, T, 0, ape.data(), ratio, d, whole);
    ASSERT_EQ(all.rows(), T / ratio);
    std::vector<float> one_by_one;
    for (int t = 0; t < T; ++t) {
      Tensor e = be.compressor_update(at, gt, t, 1, t, ape.data(), ratio, d, single);
      one_by_one.insert(one_by_one.end(), e.ptr<float>(), e.ptr<float>() + e.numel());
    }
    ASSERT_EQ(one_by_one.size(), size_t(all.numel()));
    for (size_t i = 0; i < one_by_one.size(); ++i) ASSERT_EQ(one_by_one[i], all.ptr<float>()[i]) << ratio << " " << i;
    // Entry 0 of the overlapping compressor pools only its own 4 tokens (previous window −inf).
    if (ratio == 4) {
      for (int c = 0; c < d; ++c) {
        double m = -1e30, z = 0, u = 0;
        for (int t = 0; t < 4; ++t) m = std::max(m, double(g[size_t(t * width + d + c)] + ape[size_t(t * width + d + c)]));
        for (int t = 0; t < 4; ++t) z += std::exp(g[size_t(t * width + d + c)] + ape[size_t(t * width + d + c)] - m);
        for (int t = 0; t < 4; ++t)
          u += std::exp(g[size_t(t * width + d + c)] + ape[size_t(t * width + d + c)] - m) / z * a[size_t(t * width + d + c)];
        EXPECT_NEAR(all.ptr<float>()[c], u, 1e-5 * (1 + std::fabs(u)));
      }
    }
  }
}

TEST(CpuOps, LinearFp8MatchesDequantisedProduct) {
  // FP8 block linear = act_quant(x) · dequant(W)ᵀ, within f32 rounding.
  std::mt19937 rng(5);
  CpuBackend be;
  const int N = 256, K = 384, M = 3;
  std::vector<uint8_t> w(size_t(N) * K), s(size_t(2 * 3));
  std::uniform_int_distribution<int> code(0, 125);
  for (auto& c : w) c = uint8_t(code(rng) | (rng() & 0x80));
  for (size_t i = 0; i < s.size(); ++i) s[i] = uint8_t(120 + i);
  LinearWeight lw{"w", WeightFormat::FP8_BLOCK, N, K, w.data(), s.data(), 1.0f};
  auto x = random_bf16(size_t(M) * K, rng);
  Tensor y = be.linear(be.from_host(DType::BF16, {M, K}, x.data()), lw);
  for (int m = 0; m < M; ++m)
    for (int kb = 0; kb < K / 128; ++kb) {
      float buf[128];
      uint8_t q[128];
      for (int i = 0; i < 128; ++i) buf[i] = bf16_to_f32(x[size_t(m * K + kb * 128 + i)]);
      float sx = cpu::quantize_fp8_block(buf, 128, q);
      for (int i = 0; i < 128; ++i) x[size_t(m * K + kb * 128 + i)] = f32_to_bf16(e4m3_to_f32(q[i]) * sx);
    }
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double ref = 0;
      for (int k = 0; k < K; ++k)
        ref += double(bf16_to_f32(x[size_t(m * K + k)])) * e4m3_to_f32(w[size_t(n * K + k)]) * e8m0_to_f32(s[size_t((n / 128) * 3 + k / 128)]);
      EXPECT_NEAR(bf16_to_f32(y.ptr<uint16_t>()[m * N + n]), ref, 1e-2 * std::fabs(ref) + 1e-6) << m << " " << n;
    }
}

}  // namespace
}  // namespace dsv4
