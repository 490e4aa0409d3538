// The sampling definition (backend/cpu/sampling_reference.h) on the CPU: greedy and its ties, the
// filters' limits reducing to greedy, determinism in (seed, counter), and empirical frequencies
// against the exact softmax (renormalised over the kept set) within a stated bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "backend/cpu/sampling_reference.h"

namespace dsv4 {
namespace {

int32_t sample_one(const std::vector<float>& logits, const SamplingParams& sp, uint64_t counter) {
  int32_t out = -1;
  sample_reference(logits.data(), 1, int(logits.size()), &sp, &counter, &out);
  return out;
}

std::vector<float> random_logits(std::mt19937& rng, int vocab, float sigma) {
  std::normal_distribution<float> nd(0.f, sigma);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (auto& v : l) v = nd(rng);
  return l;
}

int argmax_lowest(const std::vector<float>& l) {
  int best = 0;
  for (int i = 1; i < int(l.size()); ++i)
    if (l[size_t(i)] > l[size_t(best)]) best = i;
  return best;
}

TEST(SamplingReference, DeterministicExpIsAccurate) {
  using sampling::exp_det;
  EXPECT_EQ(exp_det(0.0f), 1.0f);
  EXPECT_EQ(exp_det(-0.0f), 1.0f);
  EXPECT_EQ(exp_det(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp_det(-100.0f), 0.0f);
  double worst = 0;
  for (float x = -87.0f; x <= 0.0f; x += 0.001953125f * 3.7f) {
    const double want = std::exp(double(x));
    const double got = exp_det(x);
    if (want > 1e-37) worst = std::max(worst, std::fabs(got - want) / want);  // normal results only
  }
  std::printf("exp_det max relative error %.3g\n", worst);
  EXPECT_LT(worst, 5e-7);
}

TEST(SamplingReference, GreedyIsArgmaxWithTiesToLowestId) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> l = random_logits(rng, 1024, 3.f);
    if (trial % 3 == 0) {  // plant a tie at the maximum
      const int a = int(rng() % 1024), b = int(rng() % 1024);
      l[size_t(a)] = l[size_t(b)] = 50.f;
    }
    for (float t : {0.0f, -1.0f, std::nanf("")}) {
      SamplingParams sp;
      sp.temperature = t;
      sp.seed = rng();
      EXPECT_EQ(sample_one(l, sp, rng()), argmax_lowest(l));
    }
  }
  // NaN never wins; all −inf (or all NaN) → token 0; +inf is a finite-max failure → greedy.
  const float inf = std::numeric_limits<float>::infinity();
  SamplingParams hot;
  hot.temperature = 1.f;
  EXPECT_EQ(sample_one({1.f, std::nanf(""), 2.f, std::nanf("")}, SamplingParams{}, 0), 2);
  EXPECT_EQ(sample_one({-inf, -inf, -inf}, hot, 7), 0);
  EXPECT_EQ(sample_one({std::nanf(""), std::nanf("")}, hot, 7), 0);
  EXPECT_EQ(sample_one({0.f, inf, 3.f, inf}, hot, 7), 1);
  EXPECT_EQ(sample_one({-0.0f, 0.0f}, SamplingParams{}, 0), 0);  // −0 ties with +0
}

TEST(SamplingReference, LimitsOfTheFiltersAreGreedy) {
  std::mt19937 rng(2);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> l = random_logits(rng, 1024, 2.f);
    const int want = argmax_lowest(l);
    SamplingParams k1;
    k1.temperature = 1.5f;
    k1.top_k = 1;
    k1.seed = rng();
    SamplingParams p0 = k1;
    p0.top_k = 0;
    p0.top_p = 1e-9f;
    SamplingParams pz = p0;
    pz.top_p = 0.f;
    SamplingParams m1 = p0;
    m1.top_p = 1.f;
    m1.min_p = 1.f;
    const uint64_t c = rng();
    EXPECT_EQ(sample_one(l, k1, c), want);
    EXPECT_EQ(sample_one(l, p0, c), want);
    EXPECT_EQ(sample_one(l, pz, c), want);
    EXPECT_EQ(sample_one(l, m1, c), want);
  }
}

TEST(SamplingReference, DeterministicInSeedAndCounter) {
  std::mt19937 rng(3);
  const int vocab = 1024, rows = 16;
  std::vector<float> logits(size_t(rows) * vocab);
  for (auto& v : logits) v = std::normal_distribution<float>(0.f, 1.f)(rng);
  std::vector<SamplingParams> params(rows);
  std::vector<uint64_t> counters(rows);
  for (int r = 0; r < rows; ++r) {
    params[size_t(r)].temperature = 0.5f + 0.1f * float(r);
    params[size_t(r)].top_k = r % 3 == 0 ? 50 : 0;
    params[size_t(r)].top_p = r % 2 ? 0.9f : 1.f;
    params[size_t(r)].min_p = r % 4 == 1 ? 0.05f : 0.f;
    params[size_t(r)].seed = 1234 + uint64_t(r);
    counters[size_t(r)] = uint64_t(r) * 17;
  }
  std::vector<int32_t> a(rows), b(rows);
  sample_reference(logits.data(), rows, vocab, params.data(), counters.data(), a.data());
  sample_reference(logits.data(), rows, vocab, params.data(), counters.data(), b.data());
  EXPECT_EQ(a, b);
  for (int r = 0; r < rows; ++r) {  // alone = in the batch
    int32_t one = -1;
    sample_reference(logits.data() + size_t(r) * vocab, 1, vocab, &params[size_t(r)], &counters[size_t(r)], &one);
    EXPECT_EQ(one, a[size_t(r)]) << "row " << r;
  }
}

TEST(SamplingReference, DifferentCountersGiveDifferentDraws) {
  std::vector<float> flat(1024, 0.f);  // uniform over 1024 tokens
  SamplingParams sp;
  sp.temperature = 1.f;
  sp.seed = 99;
  std::set<int32_t> seen;
  for (uint64_t c = 0; c < 200; ++c) seen.insert(sample_one(flat, sp, c));
  std::printf("200 counters over a uniform 1024-token row: %zu distinct tokens\n", seen.size());
  EXPECT_GT(seen.size(), 150u);  // expected ≈ 182 for 200 uniform draws
  SamplingParams other = sp;
  other.seed = 100;
  int same = 0;
  for (uint64_t c = 0; c < 200; ++c) same += sample_one(flat, sp, c) == sample_one(flat, other, c);
  EXPECT_LT(same, 10);  // expected ≈ 0.2
}

// Frequencies over N counters against the exact renormalised softmax π: each |f − π| within
// 5 standard deviations sqrt(π(1−π)/N) plus 1e-5 (the 2^-40 mass quantisation and the ~1e-7
// relative error of exp_det are far below it). Tokens outside the kept set must never appear.
void expect_frequencies(const std::vector<float>& logits, const SamplingParams& sp, const std::vector<bool>& kept,
                        int draws) {
  const int vocab = int(logits.size());
  std::vector<double> pi(static_cast<size_t>(vocab), 0.0);
  double z = 0;
  const double mx = *std::max_element(logits.begin(), logits.end());
  for (int i = 0; i < vocab; ++i)
    if (kept[size_t(i)]) z += pi[size_t(i)] = std::exp((double(logits[size_t(i)]) - mx) / sp.temperature);
  for (auto& v : pi) v /= z;
  std::vector<int> hits(static_cast<size_t>(vocab), 0);
  for (int c = 0; c < draws; ++c) ++hits[size_t(sample_one(logits, sp, uint64_t(c)))];
  double worst_sigma = 0;
  for (int i = 0; i < vocab; ++i) {
    const double f = double(hits[size_t(i)]) / draws, p = pi[size_t(i)];
    const double sigma = std::sqrt(p * (1 - p) / draws);
    if (!kept[size_t(i)]) {
      EXPECT_EQ(hits[size_t(i)], 0) << "token " << i << " is filtered out";
      continue;
    }
    if (sigma > 0) worst_sigma = std::max(worst_sigma, std::fabs(f - p) / sigma);
    EXPECT_LE(std::fabs(f - p), 5 * sigma + 1e-5) << "token " << i << " frequency " << f << " vs " << p;
  }
  std::printf("T %.2f top_k %d top_p %.2f min_p %.2f: %d draws, worst deviation %.2f sigma\n", sp.temperature,
              sp.top_k, sp.top_p, sp.min_p, draws, worst_sigma);
}

TEST(SamplingReference, FrequenciesMatchTheSoftmax) {
  // Well-separated logits so each filter's kept set is unambiguous.
  const std::vector<float> logits = {1.0f, 3.0f, -0.5f, 2.2f, 0.3f, -2.0f, 2.9f, -1.0f};
  const int draws = 200000;
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.seed = 2024;
  expect_frequencies(logits, sp, std::vector<bool>(logits.size(), true), draws);

  SamplingParams k3 = sp;
  k3.top_k = 3;  // tokens 1, 6, 3
  expect_frequencies(logits, k3, {false, true, false, true, false, false, true, false}, draws);

  // Probabilities at T = 0.8 (descending): 1 .419, 6 .370, 3 .154, 0 .034, 4 .014, ... : the
  // shortest prefix with mass ≥ 0.8 is {1, 6, 3} (.942); with ≥ 0.6 it is {1, 6} (.788).
  SamplingParams p6 = sp;
  p6.top_p = 0.6f;
  expect_frequencies(logits, p6, {false, true, false, false, false, false, true, false}, draws);
  SamplingParams p8 = sp;
  p8.top_p = 0.8f;
  expect_frequencies(logits, p8, {false, true, false, true, false, false, true, false}, draws);

  // min_p 0.1: p/p_max = exp((l − 3)/0.8) ≥ 0.1 ⇔ l ≥ 3 − 0.8·ln 10 = 1.158: tokens 1, 3, 6.
  SamplingParams m = sp;
  m.min_p = 0.1f;
  expect_frequencies(logits, m, {false, true, false, true, false, false, true, false}, draws);

  // Everything at once: top_k 4 keeps {1, 6, 3, 0}, min_p 0.05 drops none of them
  // (token 0: exp(−2/0.8) = .082); renormalised over them the cumulative masses are .429, .807,
  // .965, 1, so top_p 0.85 keeps {1, 6, 3}.
  SamplingParams all = sp;
  all.top_k = 4;
  all.min_p = 0.05f;
  all.top_p = 0.85f;
  expect_frequencies(logits, all, {false, true, false, true, false, false, true, false}, draws);
}

TEST(SamplingReference, TiedMaximaShareTheMass) {
  const std::vector<float> logits = {0.f, 5.f, 5.f, 1.f};
  SamplingParams sp;
  sp.temperature = 1.f;
  sp.seed = 5;
  expect_frequencies(logits, sp, std::vector<bool>(4, true), 100000);
  SamplingParams k1 = sp;
  k1.top_k = 1;  // the tie goes to the lower id
  for (uint64_t c = 0; c < 100; ++c) EXPECT_EQ(sample_one(logits, k1, c), 1);
}

TEST(SamplingReference, MinPFiltersLowProbabilityTokens) {
  std::mt19937 rng(6);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> l = random_logits(rng, 1024, 2.f);
    SamplingParams sp;
    sp.temperature = 1.f;
    sp.min_p = 0.3f;
    sp.seed = rng();
    const float mx = l[size_t(argmax_lowest(l))];
    for (uint64_t c = 0; c < 50; ++c) {
      const int32_t t = sample_one(l, sp, c);
      EXPECT_GE(std::exp(double(l[size_t(t)]) - mx), 0.3 * (1 - 1e-6)) << "token " << t;
    }
  }
}

TEST(PenaltiesReference, VllmDefinitionsInOrder) {
  // ids 0..3 listed; 4 is not (unchanged). Counts: 0 = prompt only (repetition alone applies).
  std::vector<float> l = {2.f, -2.f, 3.f, 1.f, 7.f};
  const std::vector<int32_t> ids = {0, 1, 2, 3}, counts = {0, 0, 3, 1};
  apply_penalties_reference(l.data(), 5, PenaltyParams{2.f, 0.5f, 1.f}, ids.data(), counts.data(), 4);
  EXPECT_EQ(l[0], 1.f);                 // 2 / 2
  EXPECT_EQ(l[1], -4.f);                // −2 · 2
  EXPECT_EQ(l[2], 1.5f - 1.5f - 1.f);   // 3 / 2 − 0.5 · 3 − 1
  EXPECT_EQ(l[3], 0.5f - 0.5f - 1.f);   // 1 / 2 − 0.5 · 1 − 1
  EXPECT_EQ(l[4], 7.f);
  std::vector<float> neutral = {2.f, -2.f};
  const std::vector<int32_t> two = {0, 1}, ones = {1, 1};
  apply_penalties_reference(neutral.data(), 2, PenaltyParams{}, two.data(), ones.data(), 2);
  EXPECT_EQ(neutral, (std::vector<float>{2.f, -2.f})) << "neutral parameters change nothing";
  const std::vector<int32_t> outside = {5};
  EXPECT_ANY_THROW(apply_penalties_reference(l.data(), 5, PenaltyParams{}, outside.data(), ones.data(), 1));
}

TEST(LogprobsReference, LogSoftmaxAndCanonicalTopOrder) {
  std::mt19937 rng(8);
  std::vector<float> l = random_logits(rng, 64, 3.f);
  l[10] = l[20] = 40.f;  // tied maximum: the lower id first
  l[30] = -std::numeric_limits<float>::infinity();
  l[31] = std::nanf("");
  const TokenLogprobs all = logprobs_reference(l.data(), 64, 20, 64);
  ASSERT_EQ(all.top_ids.size(), 64u);
  EXPECT_EQ(all.top_ids[0], 10);
  EXPECT_EQ(all.top_ids[1], 20);
  EXPECT_EQ(all.top[0], all.top[1]);
  EXPECT_EQ(all.chosen, all.top[1]);
  double mass = 0;
  for (size_t k = 0; k < all.top.size(); ++k) {
    mass += std::exp(double(all.top[k]));
    if (k) {
      EXPECT_LE(all.top[k], all.top[k - 1]);
    }
  }
  EXPECT_NEAR(mass, 1.0, 1e-6);
  EXPECT_EQ(logprobs_reference(l.data(), 64, 30, 0).chosen, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(logprobs_reference(l.data(), 64, 31, 0).chosen, -std::numeric_limits<float>::infinity()) << "NaN counts as −inf";
  const std::vector<float> dead(8, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(logprobs_reference(dead.data(), 8, 3, 0).chosen, 0.f) << "no finite logit: the maxima share certainty";
}

}  // namespace
}  // namespace dsv4
