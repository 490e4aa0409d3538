// The CPU twin of the GPU sampler (backend/cuda/sampling.cu): the definition in
// sampling_reference.h, done the direct way — sort the candidates, walk prefixes.
#include "backend/cpu/sampling_reference.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "core/error.h"

namespace dsv4 {

namespace {

struct Candidate {
  uint64_t key;  // sampling::order_key
  float p;
  uint64_t mass;
};

int32_t sample_row(const float* logits, int vocab, const SamplingParams& sp, uint64_t counter) {
  using namespace sampling;
  uint64_t best = 0;
  for (int i = 0; i < vocab; ++i) best = std::max(best, order_key(logits[i], i));
  const int best_id = key_token(best);
  const float max_logit = sanitize_logit(logits[best_id]);
  if (is_greedy(sp, max_logit)) return best_id;

  std::vector<Candidate> kept;
  for (int i = 0; i < vocab; ++i) {
    const float p = token_weight(logits[i], max_logit, sp.temperature);
    const uint64_t q = token_mass(p);
    if (q > 0) kept.push_back({order_key(logits[i], i), p, q});
  }
  std::sort(kept.begin(), kept.end(), [](const Candidate& a, const Candidate& b) { return a.key > b.key; });
  if (sp.top_k > 0 && size_t(sp.top_k) < kept.size()) kept.resize(size_t(sp.top_k));
  if (min_p_active(sp)) {
    const float threshold = min_p_threshold(sp);
    std::erase_if(kept, [&](const Candidate& c) { return !(c.p >= threshold); });
  }
  uint64_t kept_mass = 0;
  for (const Candidate& c : kept) kept_mass += c.mass;
  if (top_p_active(sp)) {
    const uint64_t target = top_p_target(sp.top_p, kept_mass);
    uint64_t cum = 0;
    size_t n = 0;
    while (n < kept.size() && cum < target) cum += kept[n++].mass;
    kept.resize(n);
    kept_mass = cum;
  }
  // kept is never empty: the maximum has p = 1 (mass 2^40) and survives every filter.
  DSV4_CHECK(!kept.empty() && kept_mass > 0, "sample_reference: no token kept");
  const uint64_t r = scale_draw(sampling_hash(sp.seed, counter), kept_mass);
  uint64_t cum = 0;
  for (const Candidate& c : kept) {
    cum += c.mass;
    if (cum > r) return key_token(c.key);
  }
  return key_token(kept.back().key);  // unreachable: r < kept_mass
}

}  // namespace

void sample_reference(const float* logits, int64_t rows, int vocab, const SamplingParams* params,
                      const uint64_t* counters, int32_t* out) {
  DSV4_CHECK(vocab > 0, "sample_reference: vocab {}", vocab);
  for (int64_t r = 0; r < rows; ++r)
    out[r] = sample_row(logits + r * int64_t(vocab), vocab, params[r], counters[r]);
}

void apply_penalties_reference(float* logits, int vocab, const PenaltyParams& params, const int32_t* ids,
                               const int32_t* output_counts, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    DSV4_CHECK(ids[i] >= 0 && ids[i] < vocab, "apply_penalties: token id {} outside the vocabulary {}", ids[i], vocab);
    logits[ids[i]] = sampling::penalized_logit(logits[ids[i]], params, output_counts[i]);
  }
}

TokenLogprobs logprobs_reference(const float* logits, int vocab, int32_t chosen, int top_n) {
  using namespace sampling;
  DSV4_CHECK(vocab > 0 && chosen >= 0 && chosen < vocab && top_n >= 0 && top_n <= vocab,
             "logprobs: chosen {} / top {} for vocab {}", chosen, top_n, vocab);
  uint64_t best = 0;
  for (int i = 0; i < vocab; ++i) best = std::max(best, order_key(logits[i], i));
  const float max_logit = sanitize_logit(logits[key_token(best)]);
  const bool finite = std::isfinite(max_logit);
  double sum = 0;
  if (finite)
    for (int i = 0; i < vocab; ++i) sum += std::exp(double(sanitize_logit(logits[i])) - double(max_logit));
  const double lse = double(max_logit) + std::log(sum);
  auto logprob = [&](int id) {
    const float l = sanitize_logit(logits[id]);
    if (!finite) return l == max_logit ? 0.0f : -std::numeric_limits<float>::infinity();
    return float(double(l) - lse);
  };
  TokenLogprobs out;
  out.chosen = logprob(chosen);
  std::vector<uint64_t> keys(static_cast<size_t>(vocab));
  for (int i = 0; i < vocab; ++i) keys[size_t(i)] = order_key(logits[i], i);
  std::partial_sort(keys.begin(), keys.begin() + top_n, keys.end(), std::greater<>());
  for (int k = 0; k < top_n; ++k) {
    out.top_ids.push_back(key_token(keys[size_t(k)]));
    out.top.push_back(logprob(out.top_ids.back()));
  }
  return out;
}

}  // namespace dsv4
