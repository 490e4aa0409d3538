// Lightning-indexer scores and top-k on the GPU against the CPU reference (cpu/indexer_reference.h)
// on fresh random FP4-simulated data: the bf16 scores must agree (exactly wherever no f32
// summation order can change them, else within 1 ulp) and the selected
// sets must be equal (ties → lower index), in ascending key order; outputs are poisoned first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "backend/cpu/indexer_reference.h"
#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/indexer_topk.h"
#include "backend/kv_cache_layout.h"
#include "core/dtypes.h"
#include "gpu_test_rng.h"

namespace dsv4::cuda {
namespace {

namespace kl = dsv4::kv_layout;

std::mt19937& rng() { return test::fresh_rng("indexer_gpu_test"); }

// bf16 vector of 128 through the FP4 simulation (SPEC §2.6), via the cache codec.
void fp4_simulated(float* v, float magnitude) {
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int i = 0; i < 128; ++i) v[i] = round_bf16(nd(rng()) * magnitude);
  uint8_t packed[64], scales[4];
  kl::encode_index_key_fp4(v, packed, scales);
  kl::decode_index_key_fp4(packed, scales, v);
}

// zero_keys: the fraction of keys that are zero vectors. Their scores are exactly 0, so with few
// positive scores the k-th largest is 0 and the selection hinges on ties broken by index across the
// top-k kernel's warps.
void run_case(const std::vector<int>& key_counts, int k, float zero_keys = 0.f) {
  const int T = int(key_counts.size());  // one sequence per query
  const int max_keys = std::max(1, *std::max_element(key_counts.begin(), key_counts.end()));
  const int pages_per_seq = (max_keys + kl::kEntriesPerPage - 1) / kl::kEntriesPerPage;
  const int pool_pages = T * pages_per_seq + 1;
  std::vector<int32_t> perm(pool_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng());
  std::vector<int32_t> table(size_t(T) * pages_per_seq), query_seq(T);
  for (size_t i = 0; i < table.size(); ++i) table[i] = perm[i];
  std::iota(query_seq.begin(), query_seq.end(), 0);

  std::vector<uint8_t> pool(size_t(pool_pages) * kl::kIndexFp4PageBytes, 0xcd);
  std::vector<float> v(128);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  for (int64_t g = 0; g < int64_t(pool_pages) * kl::kEntriesPerPage; ++g) {
    fp4_simulated(v.data(), 1.0f);
    if (unit(rng()) < zero_keys) std::fill(v.begin(), v.end(), 0.f);
    kl::encode_index_key_fp4_at(pool.data(), g, v.data());
  }
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> q(size_t(T) * 64 * 128), w(size_t(T) * 64);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < 64; ++h) {
      fp4_simulated(v.data(), 2.0f);
      for (int d = 0; d < 128; ++d) q[(size_t(t) * 64 + h) * 128 + d] = f32_to_bf16(v[d]);
      w[size_t(t) * 64 + h] = f32_to_bf16(nd(rng()) * 0.05f);
    }

  cpu::IndexerBatch b;
  b.num_queries = T;
  b.q = q.data();
  b.weights = w.data();
  b.key_pool = pool.data();
  b.block_table = table.data();
  b.pages_stride = pages_per_seq;
  b.query_seq = query_seq.data();
  b.key_counts = key_counts.data();
  std::vector<int32_t> want(size_t(T) * k);
  std::vector<float> want_scores(size_t(T) * max_keys, 0.f);
  cpu::indexer_topk_reference(b, k, want.data(), want_scores.data(), max_keys);

  Stream stream;
  DeviceBuffer<uint8_t> d_pool(pool.size());
  d_pool.upload(pool, stream.get());
  DeviceBuffer<int32_t> d_table(table.size()), d_seq(T), d_counts(T), d_topk(size_t(T) * k);
  d_table.upload(table, stream.get());
  d_seq.upload(query_seq, stream.get());
  d_counts.upload(key_counts, stream.get());
  d_topk.fill_bytes(0x7f, stream.get());
  DeviceBuffer<__nv_bfloat16> d_q(q.size()), d_w(w.size());
  d_q.upload(reinterpret_cast<const __nv_bfloat16*>(q.data()), q.size(), stream.get());
  d_w.upload(reinterpret_cast<const __nv_bfloat16*>(w.data()), w.size(), stream.get());
  IndexerWorkspace ws(T, max_keys);
  DSV4_CUDA_CHECK(cudaMemsetAsync(ws.scores(), 0xff, size_t(T) * ws.score_stride() * 2, stream.get()));
  IndexerArgs a;
  a.q = d_q.get();
  a.weights = d_w.get();
  a.key_pool = d_pool.get();
  a.block_table = d_table.get();
  a.pages_stride = pages_per_seq;
  a.query_seq = d_seq.get();
  a.key_counts = d_counts.get();
  a.num_queries = T;
  a.max_keys = max_keys;
  a.k = k;
  a.topk = d_topk.get();
  indexer_topk(ws, a, stream.get());
  DSV4_CUDA_CHECK(cudaGetLastError());
  std::vector<int32_t> got = d_topk.download(stream.get());
  std::vector<uint16_t> got_scores(size_t(T) * ws.score_stride());
  DSV4_CUDA_CHECK(cudaMemcpyAsync(got_scores.data(), ws.scores(), got_scores.size() * 2, cudaMemcpyDeviceToHost,
                                  stream.get()));
  stream.sync();

  // Whether a summation order could change the bf16 score of (query t, key j): an f32 sum of n
  // terms in any order lies within (n − 1)·2^-24·Σ|terms| of the exact sum (double here), so where
  // that interval rounds to one bf16 value at every rounding point (each head's 128-term dot, the
  // 64-term head sum), every order — the tensor cores', the GPU's head tree — gives the reference's
  // score, and the scores must be equal. Only where an interval straddles a bf16 boundary may they
  // differ, by 1 ulp.
  auto order_sensitive = [&](int t, int j) {
    float key[128];
    const int64_t g = int64_t(table[size_t(t) * pages_per_seq + j / kl::kEntriesPerPage]) * kl::kEntriesPerPage +
                      j % kl::kEntriesPerPage;
    kl::decode_index_key_fp4_at(pool.data(), g, key);
    auto straddles = [](double exact, double bound) {
      bound = bound * (1 + 1e-6) + 1e-300;  // margin for the double → f32 conversion of the ends
      return f32_to_bf16(float(exact - bound)) != f32_to_bf16(float(exact + bound));
    };
    double sum = 0, sum_abs = 0;
    for (int h = 0; h < 64; ++h) {
      double dot = 0, dot_abs = 0;
      for (int d = 0; d < 128; ++d) {
        const double term = double(bf16_to_f32(q[(size_t(t) * 64 + h) * 128 + d])) * double(key[d]);
        dot += term;
        dot_abs += std::fabs(term);
      }
      if (straddles(dot, 127 * std::ldexp(1.0, -24) * dot_abs)) return true;
      const float prod = round_bf16(std::max(round_bf16(float(dot)), 0.f) * bf16_to_f32(w[size_t(t) * 64 + h]));
      sum += double(prod);
      sum_abs += std::fabs(double(prod));
    }
    return straddles(sum, 63 * std::ldexp(1.0, -24) * sum_abs);
  };
  auto one_ulp_apart = [](float a, float b) {
    const uint16_t x = f32_to_bf16(a), y = f32_to_bf16(b);
    return (x & 0x8000) == (y & 0x8000) && (x > y ? x - y : y - x) == 1;
  };
  int score_mismatch = 0, order_differences = 0, total = 0;
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < key_counts[t]; ++j) {
      ++total;
      const float g = bf16_to_f32(indexer_score_bits(got_scores[size_t(t) * ws.score_stride() + j]));
      const float r = want_scores[size_t(t) * max_keys + j];
      if (g == r) continue;
      if (one_ulp_apart(g, r) && order_sensitive(t, j)) {
        ++order_differences;
        continue;
      }
      if (++score_mismatch <= 5)
        ADD_FAILURE() << "query " << t << " key " << j << ": score " << g << ", reference " << r
                      << " (no summation order changes this score, or they are more than 1 ulp apart)";
    }
  for (int t = 0; t < T; ++t) {
    const int32_t* gt = &got[size_t(t) * k];
    const int32_t* wt = &want[size_t(t) * k];
    std::set<int32_t> gs(gt, gt + k), ws_set(wt, wt + k);
    EXPECT_EQ(gs, ws_set) << "query " << t << " (" << key_counts[t] << " keys, k " << k << "): top-k sets differ";
    const int take = std::min(k, key_counts[t]);
    for (int i = 0; i < k; ++i) {
      if (i >= take) { EXPECT_EQ(gt[i], -1); continue; }
      ASSERT_GE(gt[i], 0);
      ASSERT_LT(gt[i], key_counts[t]);
      if (i > 0) ASSERT_LT(gt[i - 1], gt[i]) << "query " << t << " position " << i << ": not ascending";
    }
  }
  int most_ties = 0;  // keys equal to the k-th largest score, over the queries that must choose
  for (int t = 0; t < T; ++t) {
    if (key_counts[t] <= k) continue;
    const float kth = want_scores[size_t(t) * max_keys + want[size_t(t) * k + k - 1]];
    most_ties = std::max(most_ties, int(std::count(&want_scores[size_t(t) * max_keys],
                                                   &want_scores[size_t(t) * max_keys] + key_counts[t], kth)));
  }
  std::printf("  T=%d max_keys=%d k=%d: %d / %d scores differ (%d more by 1 ulp where a summation "
              "order can round either way); up to %d keys tie with the k-th\n",
              T, max_keys, k, score_mismatch, total, order_differences, most_ties);
  // Every score is the reference's bf16 value wherever no f32 summation order can change it (same
  // rounding points); elsewhere at most 1 bf16 ulp.
  EXPECT_EQ(score_mismatch, 0);
}

// The scores' integer order keys: bf16 bits back unchanged (−0 as +0), and integer order = score order.
TEST(IndexerOrderKey, RoundTripsAndOrders) {
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const float x = bf16_to_f32(uint16_t(bits));
    if (x != x) continue;  // NaN: no order
    const uint32_t key = indexer_order_key(bits);
    EXPECT_EQ(bf16_to_f32(indexer_score_bits(key)), x) << bits;
    const uint32_t next = bits == 0xffffu ? 0u : bits + 1;
    const float y = bf16_to_f32(uint16_t(next));
    if (y == y) EXPECT_EQ(x < y, key < indexer_order_key(next)) << bits;
  }
}

TEST(IndexerGpu, Batch1Over16384KeysTop512) { run_case({16384}, 512); }

TEST(IndexerGpu, MixedKeyCountsTop512) { run_case({0, 1, 100, 511, 512, 513, 3000, 16384, 64, 65}, 512); }

TEST(IndexerGpu, OtherK) {
  run_case({5000, 20000, 2047, 2049}, 2048);
  run_case({700, 3}, 1);
  run_case({1000, 999}, 100);
}

TEST(IndexerGpu, ManyTiesAtZero) {
  run_case({16384, 5000, 3000, 600}, 512, 0.98f);
  run_case({20000, 9000}, 2048, 0.95f);
  // Slice boundaries (kIndexerTopkSliceKeys) with ties spread over many slices.
  run_case({8193, 24577, 8192, 8191}, 512, 0.99f);
  run_case({100000}, 2048, 0.99f);
}

TEST(IndexerGpu, Over262144Keys) { run_case({262144}, 512); }

TEST(IndexerGpuSanitizer, Small) { run_case({300, 40, 0}, 64); }

}  // namespace
}  // namespace dsv4::cuda
