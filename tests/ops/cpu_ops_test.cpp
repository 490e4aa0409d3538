// Properties of the CPU reference ops on fresh random inputs, checked against plain
// double-precision formulas (the golden tests check them against the reference itself).
#include <array>
#include <gtest/gtest.h>

#include <algorithm>
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

// Half a bf16 ulp at a bf16 value x: how far the exact value may lie from its bf16 rounding x.
double half_bf16_ulp(double x) {
  if (x == 0) return std::ldexp(1.0, -134);  // half the smallest subnormal
  int e;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e); bf16 has 8 significant bits
  return std::ldexp(1.0, std::max(e - 1, -126) - 8);
}

// e4m3fn magnitude of code c (0…126) from the format's definition (bias 7, 3 mantissa bits,
// subnormals below 2^-6), not from the codec under test.
double e4m3_magnitude(int c) {
  const int exp_field = c >> 3, mant = c & 7;
  return exp_field == 0 ? std::ldexp(mant / 8.0, -6) : std::ldexp(1.0 + mant / 8.0, exp_field - 7);
}
double e4m3_value(uint8_t code) { return (code & 0x80 ? -1 : 1) * e4m3_magnitude(code & 0x7f); }

// SPEC §2.2 act_quant of one block, written independently of cpu::quantize_fp8_block: amax (floor
// 1e-4) times the f32 constant 1/448, rounded up to a power of two; values to the nearest e4m3
// (ties to the even code), clamped to ±448. Returns the dequantised values q · s.
std::vector<double> act_quant_dequant(const float* x, int n) {
  float amax = 0;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float t = std::max(amax, 1e-4f) * (1.0f / 448.0f);
  int e;
  const double m = std::frexp(double(t), &e);  // t = m · 2^e, m in [0.5, 1)
  const double s = m == 0.5 ? std::ldexp(1.0, e - 1) : std::ldexp(1.0, e);
  std::vector<double> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const double y = std::min(std::fabs(double(x[i]) / s), 448.0);
    int best = 0;
    for (int c = 1; c <= 126; ++c) {
      const double dc = std::fabs(e4m3_magnitude(c) - y), db = std::fabs(e4m3_magnitude(best) - y);
      if (dc < db || (dc == db && c % 2 == 0)) best = c;
    }
    out[size_t(i)] = (x[i] < 0 ? -1 : 1) * e4m3_magnitude(best) * s;
  }
  return out;
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
    be.write_entries(x, upload_i32(be, {5}), pool);
    float back[512];
    kv_layout::decode_kv_entry_at(pool.storage.ptr<uint8_t>(), 5, back);
    for (int i = 0; i < 512; ++i) ASSERT_EQ(back[i], bf16_to_f32(x.ptr<uint16_t>()[i])) << i;
  }
}

TEST(CpuOps, HadamardMatchesSylvesterMatrix) {
  // SPEC §2.7: rotate(x) = H·x/√128 with the Sylvester matrix, built here by its [[H, H], [H, −H]]
  // recursion (not the butterflies of hadamard128). The op sums in f32 and rounds once to bf16, so
  // each output is the bf16 rounding of the exact product up to f32 rounding: within half a bf16
  // ulp of the output plus an f32 bound (7 butterfly levels, the f32 scale and its product: 9 u · Σ|x|/√128).
  std::vector<std::vector<double>> H{{1.0}};
  while (H.size() < 128) {
    const size_t n = H.size();
    std::vector<std::vector<double>> next(2 * n, std::vector<double>(2 * n));
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < n; ++j) {
        next[i][j] = next[i][j + n] = next[i + n][j] = H[i][j];
        next[i + n][j + n] = -H[i][j];
      }
    H = std::move(next);
  }
  std::mt19937 rng(2);
  std::vector<std::vector<uint16_t>> inputs;
  for (int i = 0; i < 128; ++i) {  // unit vectors: each output is one column of H/√128
    std::vector<uint16_t> e(128, 0);
    e[size_t(i)] = f32_to_bf16(1.0f);
    inputs.push_back(e);
  }
  for (int rep = 0; rep < 20; ++rep) inputs.push_back(random_bf16(128, rng, std::exp2(float(rep % 5) - 2)));
  for (const auto& v : inputs) {
    auto w = v;
    cpu::hadamard128(w.data());
    double l1 = 0;
    for (int j = 0; j < 128; ++j) l1 += std::fabs(bf16_to_f32(v[size_t(j)]));
    const double f32_bound = 9 * std::ldexp(1.0, -24) * l1 / std::sqrt(128.0);
    for (int i = 0; i < 128; ++i) {
      double want = 0;
      for (int j = 0; j < 128; ++j) want += H[size_t(i)][size_t(j)] * bf16_to_f32(v[size_t(j)]);
      want /= std::sqrt(128.0);
      const double got = bf16_to_f32(w[size_t(i)]);
      ASSERT_LE(std::fabs(got - want), half_bf16_ulp(got) + f32_bound) << "output " << i << ": " << got << " vs " << want;
    }
  }
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
  std::vector<int32_t> ids(n_entries);
  std::iota(ids.begin(), ids.end(), 0);
  be.write_entries(kvt, upload_i32(be, ids), pool);
  const int T = 3;
  auto q = random_bf16(size_t(T) * H * d, rng, 0.05f);
  Tensor qt = be.from_host(DType::BF16, {T, H, d}, q.data());
  std::vector<int32_t> lists(size_t(T) * list_len, -1);
  std::uniform_int_distribution<int> pick(0, n_entries - 1);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < list_len - 7 * t; ++i) lists[size_t(t * list_len + i)] = pick(rng);
  float sink[H] = {0.5f, -1.0f, 2.0f, 0.0f};
  const float scale = 1.0f / std::sqrt(512.0f);
  Tensor lt = be.from_host(DType::I32, {T, list_len}, lists.data());
  Tensor o = be.sparse_attention(qt, H, d, pool, lt, sink, scale);
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
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  be.write_entries(kt, upload_i32(be, ids), pool);
  std::vector<uint16_t> q(size_t(H) * 128, 0), w(H, f32_to_bf16(1.0f));
  q[0] = q[128] = f32_to_bf16(1.0f);
  Tensor qt = be.from_host(DType::BF16, {T, H, 128}, q.data()), wt = be.from_host(DType::BF16, {T, H}, w.data());
  // One span whose block table is page 0: keys j are entries 0..n−1.
  KeyTables tables{upload_i32(be, {0}), upload_i32(be, {0}), upload_i32(be, {n}), n};
  Tensor top = be.indexer_topk(qt, wt, H, pool, tables, k);
  std::vector<int32_t> got(k);
  be.to_host(top, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{2, 5, 8, 1}));  // highest first; ties to the lower index
  tables.counts = upload_i32(be, {2});
  top = be.indexer_topk(qt, wt, H, pool, tables, k);  // fewer keys than k: −1 fill
  be.to_host(top, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{1, 0, -1, -1}));
}

// One compressor_update over spans {row0, n, pos0} with their state slots; `pad` rows past the
// completed entries.
Tensor compress_spans(Backend& be, const Tensor& a, const Tensor& g, const std::vector<std::array<int32_t, 3>>& spans,
                      const std::vector<int32_t>& slots, const float* ape, CompressorStates& st, int64_t pad = 0) {
  std::vector<int32_t> flat;
  int64_t entries = 0, longest = 0;
  for (auto& s : spans) {
    flat.insert(flat.end(), s.begin(), s.end());
    entries += (s[2] + s[1]) / st.ratio - s[2] / st.ratio;
    longest = std::max<int64_t>(longest, s[1]);
  }
  StepTables tables;
  tables.spans = be.from_host(DType::I32, {int64_t(spans.size()), 3}, flat.data());
  Tensor slot_t = upload_i32(be, slots);
  return be.compressor_update(a, g, tables, slot_t, entries + pad, longest, ape, st);
}

TEST(CpuOps, CompressorChunkingIsInvariant) {
  // The state machine gives the same entries whether tokens come one by one or all at once, and
  // whether spans of several sequences go in one call or one by one.
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  CpuBackend be;
  for (int ratio : {4, 128}) {
    const int d = 64, coff = ratio == 4 ? 2 : 1, width = coff * d, T = 300;
    std::vector<float> a(size_t(T) * width), g(size_t(T) * width), ape(size_t(ratio) * width);
    for (auto* v : {&a, &g, &ape})
      for (auto& x : *v) x = nd(rng);
    Tensor at = be.from_host(DType::F32, {T, width}, a.data()), gt = be.from_host(DType::F32, {T, width}, g.data());
    CompressorStates st;
    st.ratio = ratio, st.d = d;
    be.grow_compressor_states(st, 4);
    for (int s = 0; s < 4; ++s) be.compressor_state_init(st, s);
    const int64_t pad = 3;
    Tensor all = compress_spans(be, at, gt, {{0, T, 0}}, {0}, ape.data(), st, pad);
    ASSERT_EQ(all.rows(), T / ratio + pad);
    for (int64_t i = (T / ratio) * d; i < all.numel(); ++i) ASSERT_EQ(all.ptr<float>()[i], 0.0f) << "padding row";
    all.shape[0] = T / ratio;
    std::vector<float> one_by_one;
    for (int t = 0; t < T; ++t) {
      Tensor e = compress_spans(be, at, gt, {{t, 1, t}}, {1}, ape.data(), st);
      one_by_one.insert(one_by_one.end(), e.ptr<float>(), e.ptr<float>() + e.numel());
    }
    ASSERT_EQ(one_by_one.size(), size_t(all.numel()));
    for (size_t i = 0; i < one_by_one.size(); ++i) ASSERT_EQ(one_by_one[i], all.ptr<float>()[i]) << ratio << " " << i;
    // Two sequences in one call (slots 2, 3: rows 0..149 at positions 0.., rows 150..299 at
    // positions 0..) give each the entries it gives alone.
    Tensor both = compress_spans(be, at, gt, {{0, 150, 0}, {150, 150, 0}}, {2, 3}, ape.data(), st);
    be.compressor_state_init(st, 2);
    Tensor first = compress_spans(be, at, gt, {{0, 150, 0}}, {2}, ape.data(), st);
    be.compressor_state_init(st, 2);
    Tensor second = compress_spans(be, at, gt, {{150, 150, 0}}, {2}, ape.data(), st);
    ASSERT_EQ(both.numel(), first.numel() + second.numel());
    for (int64_t i = 0; i < first.numel(); ++i) ASSERT_EQ(both.ptr<float>()[i], first.ptr<float>()[i]);
    for (int64_t i = 0; i < second.numel(); ++i) ASSERT_EQ(both.ptr<float>()[first.numel() + i], second.ptr<float>()[i]);
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
  // FP8 block linear (SPEC §2.3) = act_quant(x) · dequant(W)ᵀ, the expectation built independently
  // (act_quant_dequant, the e4m3 grid, e8m0 = 2^(code − 127)) and exact in double. The op rounds
  // each K block's partial sum to f32 and accumulates the scaled partials in f32 (nb blocks: at most
  // (nb + 1) u · Σ|partial · scale| apart from the exact sum, u = 2^-24), then rounds to bf16 (half
  // a bf16 ulp of the output).
  std::mt19937 rng(5);
  CpuBackend be;
  const int N = 256, K = 384, M = 3, nb = K / 128;
  std::vector<uint8_t> w(size_t(N) * K), s(size_t(2 * nb));
  std::uniform_int_distribution<int> code(0, 125);
  for (auto& c : w) c = uint8_t(code(rng) | (rng() & 0x80));
  for (size_t i = 0; i < s.size(); ++i) s[i] = uint8_t(120 + i);
  LinearWeight lw{"w", WeightFormat::FP8_BLOCK, N, K, w.data(), s.data(), 1.0f};
  auto x = random_bf16(size_t(M) * K, rng);
  Tensor y = be.linear(be.from_host(DType::BF16, {M, K}, x.data()), lw);
  std::vector<double> xq(size_t(M) * K);
  for (int m = 0; m < M; ++m)
    for (int kb = 0; kb < nb; ++kb) {
      float buf[128];
      for (int i = 0; i < 128; ++i) buf[i] = bf16_to_f32(x[size_t(m * K + kb * 128 + i)]);
      std::vector<double> q = act_quant_dequant(buf, 128);
      std::copy(q.begin(), q.end(), xq.begin() + m * K + kb * 128);
    }
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double ref = 0, magnitude = 0;
      for (int kb = 0; kb < nb; ++kb) {
        double partial = 0;
        for (int k = kb * 128; k < (kb + 1) * 128; ++k) partial += xq[size_t(m * K + k)] * e4m3_value(w[size_t(n * K + k)]);
        partial *= std::ldexp(1.0, int(s[size_t((n / 128) * nb + kb)]) - 127);
        ref += partial;
        magnitude += std::fabs(partial);
      }
      const double got = bf16_to_f32(y.ptr<uint16_t>()[m * N + n]);
      const double bound = half_bf16_ulp(got) + (nb + 1) * std::ldexp(1.0, -24) * magnitude;
      ASSERT_LE(std::fabs(got - ref), bound) << m << " " << n << ": " << got << " vs " << ref;
    }
}

}  // namespace
}  // namespace dsv4
