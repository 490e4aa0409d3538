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
#include "backend/cuda/moe_fp4.h"
#include "backend/cuda/router.h"
#include "core/dtypes.h"
#include "gpu_test_rng.h"

namespace dsv4::cuda {
namespace {

std::mt19937& rng() { return test::fresh_rng("router_compressor_gpu_test"); }

// ---------------------------------------------------------------------------------------------
// Routing.

enum class RouteMode { Learned, LearnedNoBias, Hash };

// A hash-routing table (each vocabulary id k distinct experts) and T random token ids.
struct HashRouting {
  std::vector<int32_t> table, token_ids;
};
HashRouting random_hash_routing(int vocab, int E, int k, int64_t T) {
  HashRouting h{std::vector<int32_t>(size_t(vocab) * k), std::vector<int32_t>(static_cast<size_t>(T))};
  for (int v = 0; v < vocab; ++v) {
    std::vector<int32_t> perm(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) perm[size_t(e)] = e;
    std::shuffle(perm.begin(), perm.end(), rng());
    std::copy_n(perm.begin(), k, h.table.begin() + size_t(v) * k);
  }
  for (auto& t : h.token_ids) t = int32_t(rng()() % vocab);
  return h;
}

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
  const HashRouting hash = random_hash_routing(1000, E, k, T);
  const std::vector<int32_t>& table = hash.table;
  const std::vector<int32_t>& token_ids = hash.token_ids;

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

// The router and the pairs' grouping in one launch (moe_route_topk_pairs, a decode step's up to 4
// tokens) against route_topk then moe_route_pairs: the same ids and weights bit for bit, the same
// slots, and each slot the same pairs (their order inside a slot follows atomics in both). Every
// output poisoned first.
void check_route_group(RouteMode mode, int T, int E, int k, bool with_passes) {
  std::normal_distribution<float> nd(0.f, 1.5f);
  std::vector<float> logits(size_t(T) * E), bias(static_cast<size_t>(E));
  for (auto& v : logits) v = nd(rng());
  for (auto& v : bias) v = nd(rng()) * 0.3f;
  if (E > 1) logits[1] = logits[0];  // an exact tie: the lower id first, in both
  const HashRouting hash = random_hash_routing(97, E, k, T);
  const std::vector<int32_t>& table = hash.table;
  const std::vector<int32_t>& token_ids = hash.token_ids;
  Stream stream;
  DeviceBuffer<float> d_logits(logits.size()), d_bias(bias.size());
  DeviceBuffer<int32_t> d_table(table.size()), d_tok(token_ids.size());
  d_logits.upload(logits, stream.get());
  d_bias.upload(bias, stream.get());
  d_table.upload(table, stream.get());
  d_tok.upload(token_ids, stream.get());
  const float* b = mode == RouteMode::Learned ? d_bias.get() : nullptr;
  const int32_t* h = mode == RouteMode::Hash ? d_table.get() : nullptr;
  const MoeFp4Shape shape{MoeFp4Format::Mxfp4, E, 128, 128, 0.f};
  struct Result {
    std::vector<int32_t> ids, active, slot_expert, slot_begin, slot_count, sorted, pass_total, pass_expert, pass_begin,
        pass_rows;
    std::vector<float> w;
  };
  const auto run = [&](bool one_launch) {
    MoeWorkspace ws(shape, 16, k);
    DeviceBuffer<int32_t> ids(size_t(T) * k);
    DeviceBuffer<float> w(size_t(T) * k);
    for (auto* buf : {&ids, &ws.active_count, &ws.slot_expert, &ws.slot_begin, &ws.slot_count, &ws.sorted_pairs,
                      &ws.pass_total, &ws.pass_expert, &ws.pass_begin, &ws.pass_rows})
      buf->fill_bytes(0xff, stream.get());
    w.fill_bytes(0xff, stream.get());
    if (one_launch) {
      EXPECT_TRUE(moe_route_topk_pairs(d_logits.get(), b, h, d_tok.get(), T, E, k, 1.5f, ids.get(), w.get(), E,
                                       with_passes, ws, stream.get()));
    } else {
      route_topk(d_logits.get(), b, h, d_tok.get(), T, E, k, 1.5f, ids.get(), w.get(), stream.get());
      moe_route_pairs(ids.get(), T, k, E, with_passes, ws, stream.get());
    }
    DSV4_CUDA_CHECK_LAUNCH();
    Result r{ids.download(stream.get()), ws.active_count.download(stream.get()), ws.slot_expert.download(stream.get()),
             ws.slot_begin.download(stream.get()), ws.slot_count.download(stream.get()),
             ws.sorted_pairs.download(stream.get()), ws.pass_total.download(stream.get()),
             ws.pass_expert.download(stream.get()), ws.pass_begin.download(stream.get()),
             ws.pass_rows.download(stream.get()), w.download(stream.get())};
    return r;
  };
  const Result two = run(false), one = run(true);
  const std::string what = "T " + std::to_string(T) + " E " + std::to_string(E) + " k " + std::to_string(k) +
                           (mode == RouteMode::Hash ? " hash" : mode == RouteMode::Learned ? " learned+bias" : " learned") +
                           (with_passes ? " passes" : "");
  EXPECT_EQ(one.ids, two.ids) << what;
  EXPECT_EQ(0, std::memcmp(one.w.data(), two.w.data(), two.w.size() * 4)) << what;
  ASSERT_EQ(one.active, two.active) << what;
  const int active = two.active[0];
  EXPECT_GE(active, 1) << what;
  EXPECT_EQ(one.slot_expert, two.slot_expert) << what;  // active slots, then −1 up to E
  for (int s = 0; s < active; ++s) {
    EXPECT_EQ(one.slot_begin[size_t(s)], two.slot_begin[size_t(s)]) << what;
    EXPECT_EQ(one.slot_count[size_t(s)], two.slot_count[size_t(s)]) << what;
    const auto first = size_t(two.slot_begin[size_t(s)]), last = first + size_t(two.slot_count[size_t(s)]);
    std::vector<int32_t> a(one.sorted.begin() + first, one.sorted.begin() + last);
    std::vector<int32_t> c(two.sorted.begin() + first, two.sorted.begin() + last);
    std::sort(a.begin(), a.end());
    std::sort(c.begin(), c.end());
    EXPECT_EQ(a, c) << what << ", slot " << s;
  }
  if (with_passes) {
    ASSERT_EQ(one.pass_total, two.pass_total) << what;
    for (int p = 0; p < two.pass_total[0]; ++p) {
      EXPECT_EQ(one.pass_expert[size_t(p)], two.pass_expert[size_t(p)]) << what;
      EXPECT_EQ(one.pass_begin[size_t(p)], two.pass_begin[size_t(p)]) << what;
      EXPECT_EQ(one.pass_rows[size_t(p)], two.pass_rows[size_t(p)]) << what;
    }
  }
}

TEST(RouteGroupOneLaunch, SameAsRouteThenGroup) {
  for (auto mode : {RouteMode::Learned, RouteMode::LearnedNoBias, RouteMode::Hash})
    for (int T : {1, 2, 3, 4}) {
      check_route_group(mode, T, 256, 6, false);
      check_route_group(mode, T, 8, 6, T == 3);
      check_route_group(mode, T, 200, 8, false);  // E not a multiple of 32
    }
  // Past its rows it enqueues nothing and says so.
  Stream stream;
  MoeWorkspace ws(MoeFp4Shape{MoeFp4Format::Mxfp4, 8, 128, 128, 0.f}, 16, 6);
  EXPECT_FALSE(moe_route_topk_pairs(nullptr, nullptr, nullptr, nullptr, kFusedRouteTokens + 1, 8, 6, 1.f, nullptr,
                                    nullptr, 8, false, ws, stream.get()));
}

// ---------------------------------------------------------------------------------------------
// Compressor.

// Feeds sequences in chunks (sequence i: chunks[i], its k-th chunk in step k) through both
// backends' compressor_update, every sequence of a step in one call — the spans in turn forward
// and backward, each sequence in its own state slot (2i + 1 of 2n) — and compares every step's
// pooled rows, the padding rows (zero), nothing written past them, and every final state.
void check_compressor_steps(int ratio, int d, const std::vector<std::vector<int64_t>>& chunks) {
  CpuBackend cpu;
  const int coff = ratio == 4 ? 2 : 1, width = coff * d;
  const int64_t n_seq = int64_t(chunks.size()), slots = 2 * n_seq, lead = 3, pad = 2;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> ape(size_t(ratio) * width);
  for (auto& v : ape) v = nd(rng()) * 0.5f;
  CompressorStates states;
  states.ratio = ratio, states.d = d;
  cpu.grow_compressor_states(states, slots);
  for (int64_t i = 0; i < slots; ++i) cpu.compressor_state_init(states, i);

  Stream stream;
  const size_t slot_floats = size_t(states.slot_floats());
  DeviceBuffer<float> d_ape(ape.size()), d_kv(slot_floats * size_t(slots)), d_sc(d_kv.size());
  d_ape.upload(ape, stream.get());
  d_kv.fill_bytes(0xff, stream.get());
  d_sc.fill_bytes(0xff, stream.get());
  for (int64_t i = 0; i < slots; ++i)
    compressor_state_init(d_kv.get() + i * slot_floats, d_sc.get() + i * slot_floats, ratio, d, stream.get());

  size_t outputs = 0, exact = 0, bad = 0, nan = 0, n_steps = 0, total = 0;
  double worst = 0;
  std::vector<int64_t> pos(size_t(n_seq), 0);
  for (size_t k = 0;; ++k) {
    std::vector<int32_t> spans, span_slots;
    int64_t rows = lead, entries = 0, longest = 0;
    for (int64_t j = 0; j < n_seq; ++j) {
      const int64_t i = k % 2 ? n_seq - 1 - j : j;
      if (k >= chunks[size_t(i)].size()) continue;
      const int64_t n = chunks[size_t(i)][k], p0 = pos[size_t(i)];
      spans.insert(spans.end(), {int32_t(rows), int32_t(n), int32_t(p0)});
      span_slots.push_back(int32_t(2 * i + 1));
      rows += n, entries += (p0 + n) / ratio - p0 / ratio, longest = std::max(longest, n);
      pos[size_t(i)] += n;
    }
    if (spans.empty()) break;
    ++n_steps, total += size_t(rows - lead);
    std::vector<float> a(size_t(rows) * width), g(a.size());
    for (auto& v : a) v = nd(rng());
    for (auto& v : g) v = nd(rng()) * 2.f;
    float max_a = 0;
    for (float v : a) max_a = std::max(max_a, std::fabs(v));
    const int64_t S = int64_t(span_slots.size()), capacity = entries + pad;
    StepTables tables;
    tables.spans = cpu.from_host(DType::I32, {S, 3}, spans.data());
    Tensor slot_t = cpu.from_host(DType::I32, {S}, span_slots.data());
    Tensor at = cpu.from_host(DType::F32, {rows, width}, a.data()), gt = cpu.from_host(DType::F32, {rows, width}, g.data());
    Tensor want = cpu.compressor_update(at, gt, tables, slot_t, capacity, longest, ape.data(), states);

    DeviceBuffer<float> d_a(a.size()), d_g(g.size()), d_out(size_t(capacity + 1) * d);
    DeviceBuffer<int32_t> d_spans(spans.size()), d_slots(span_slots.size());
    d_a.upload(a, stream.get());
    d_g.upload(g, stream.get());
    d_spans.upload(spans, stream.get());
    d_slots.upload(span_slots, stream.get());
    d_out.fill_bytes(0xff, stream.get());
    compressor_update(d_a.get(), d_g.get(), d_spans.get(), d_slots.get(), S, longest, d_ape.get(), ratio, d, d_kv.get(),
                      d_sc.get(), d_out.get(), capacity, stream.get());
    const std::vector<float> got = d_out.download(stream.get());
    for (int64_t i = 0; i < entries * d; ++i) {
      const float gv = got[size_t(i)], wv = want.ptr<float>()[i];
      ++outputs;
      if (std::isnan(gv)) { ++nan; continue; }
      const double diff = std::fabs(double(gv) - wv);
      exact += diff == 0;
      worst = std::max(worst, diff / (std::fabs(wv) + max_a));
      bad += diff > 1e-5 * (std::fabs(wv) + max_a);
    }
    for (int64_t i = entries * d; i < capacity * d; ++i) {
      EXPECT_EQ(got[size_t(i)], 0.0f) << "padding row value at " << i;
      if (got[size_t(i)] != 0.0f) break;
    }
    for (int64_t i = capacity * d; i < int64_t(got.size()); ++i) {  // past the capacity: still poisoned
      uint32_t u;
      std::memcpy(&u, &got[size_t(i)], 4);
      EXPECT_EQ(u, 0xffffffffu) << "write past the capacity at " << i;
      if (u != 0xffffffffu) break;
    }
  }
  const std::vector<float> kv = d_kv.download(stream.get()), sc = d_sc.download(stream.get());
  bool same = true;
  for (int64_t i = 0; i < n_seq; ++i) {  // the used slots (the others were never touched by either)
    const size_t off = size_t(2 * i + 1) * slot_floats;
    same = same && std::memcmp(kv.data() + off, states.kv.ptr<float>() + off, slot_floats * 4) == 0 &&
           std::memcmp(sc.data() + off, states.score.ptr<float>() + off, slot_floats * 4) == 0;
  }
  std::printf("compressor ratio %d d %d, %lld sequences, %zu tokens in %zu steps: %zu outputs, %.2f%% bit-exact, "
              "worst %.2e, %zu NaN, states %s\n",
              ratio, d, (long long)n_seq, total, n_steps, outputs, outputs ? 100.0 * exact / outputs : 100.0, worst, nan,
              same ? "bit-exact" : "DIFFER");
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(nan, 0u);
  EXPECT_TRUE(same);
}

void check_compressor(int ratio, int d, const std::vector<int64_t>& chunks) {
  check_compressor_steps(ratio, d, {chunks});
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

// Several sequences in one call, each at its own phase, as a step batches them; decode steps of
// many sequences (one row each), and a long chunk beside decode tokens (the parallel-pool path
// over every span of the step).
TEST(Compressor, ManySequencesInOneCall) {
  check_compressor_steps(4, 512, {{1, 4, 33, 300}, {3, 1, 2, 7}, std::vector<int64_t>(6, 1)});
  check_compressor_steps(128, 512, {{127, 1, 128, 5}, {1, 300, 1}, std::vector<int64_t>(4, 1)});
  std::vector<std::vector<int64_t>> decode(64, std::vector<int64_t>(9, 1));
  for (size_t i = 0; i < decode.size(); ++i) decode[i].insert(decode[i].begin(), int64_t(i % 7) + 1);
  check_compressor_steps(4, 512, decode);
  check_compressor_steps(4, 128, {{1000, 1, 1}, {5, 1, 1}, {2, 2, 2}});
  check_compressor_steps(128, 512, {{700, 1, 1}, {129, 1, 600}});
}

TEST(Compressor, Ratio128) {
  check_compressor(128, 512, {1, 4, 33, 300});
  check_compressor(128, 512, {127, 1, 128, 5});
  check_compressor(128, 64, std::vector<int64_t>(130, 1));
}

TEST(RouterCompressorSanitizer, Small) {
  check_route_group(RouteMode::Learned, 2, 8, 6, true);
  check_route_group(RouteMode::Hash, 4, 256, 6, false);
  check_route(RouteMode::Learned, 5, 8, 6, 128);
  check_route(RouteMode::Hash, 3, 40, 6, 128);
  check_compressor(4, 64, {5, 3});
  check_compressor(128, 32, {130});
  check_compressor(4, 64, {3, 40, 1});
  check_compressor(128, 32, {600, 2});
  check_compressor_steps(4, 64, {{5, 1}, {2, 9, 1}});
}

}  // namespace
}  // namespace dsv4::cuda
