// Penalties and logprobs on the GPU (backend/cuda/logit_processing.h) against their CPU twins
// (backend/cpu/sampling_reference.h). Penalties must match bit for bit (explicitly rounded f32
// steps) and leave every unlisted logit alone; logprobs must pick the same top tokens in the same
// (canonical) order and agree in value to the stated ~1e-6. Rows mix ties, −inf and NaN logits;
// outputs are poisoned first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/sampling_reference.h"
#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/logit_processing.h"
#include "core/dtypes.h"
#include "gpu_test_rng.h"

namespace dsv4::cuda {
namespace {

std::mt19937& rng() { return test::fresh_rng("logit_processing_gpu_test"); }

std::vector<float> random_logits(int64_t rows, int vocab) {
  std::vector<float> logits(size_t(rows) * vocab);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int64_t r = 0; r < rows; ++r) {
    float* l = logits.data() + size_t(r) * vocab;
    const int style = int(r % 5);
    for (int i = 0; i < vocab; ++i) {
      l[i] = nd(rng());
      if (style == 1) l[i] = bf16_to_f32(f32_to_bf16(l[i]));  // many exact ties
      if (style == 2 && i % 7 == 0) l[i] = -INFINITY;
      if (style == 3 && i % 11 == 0) l[i] = std::nanf("");
    }
    if (style == 4) l[rng()() % vocab] = l[rng()() % vocab] = 25.f;  // tie at the maximum
  }
  return logits;
}

TEST(ApplyPenalties, BitExactAndOnlyListedLogits) {
  for (int vocab : {1000, 129280}) {
    const int64_t rows = 9;
    std::vector<float> logits = random_logits(rows, vocab);
    const float repetitions[] = {1.f, 1.3f, 0.7f}, frequencies[] = {0.f, 0.5f, -0.3f}, presences[] = {0.f, 1.f, -0.5f};
    std::vector<PenaltyParams> params(static_cast<size_t>(rows));
    std::vector<int32_t> entry_rows, ids, counts;
    std::vector<float> want = logits;
    for (int64_t r = 0; r < rows; ++r) {
      params[size_t(r)] = {repetitions[r % 3], frequencies[(r / 3) % 3], presences[(r + 1) % 3]};
      std::vector<int32_t> row_ids, row_counts;
      std::vector<bool> used(size_t(vocab), false);
      const int n = int(rng()() % 300);
      for (int k = 0; k < n; ++k) {
        const int32_t id = int32_t(rng()() % vocab);
        if (used[size_t(id)]) continue;
        used[size_t(id)] = true;
        row_ids.push_back(id);
        row_counts.push_back(int32_t(rng()() % 6));  // 0: a prompt-only token
      }
      apply_penalties_reference(want.data() + size_t(r) * vocab, vocab, params[size_t(r)], row_ids.data(), row_counts.data(),
                                int64_t(row_ids.size()));
      for (size_t k = 0; k < row_ids.size(); ++k) entry_rows.push_back(int32_t(r)), ids.push_back(row_ids[k]), counts.push_back(row_counts[k]);
    }
    Stream stream;
    DeviceBuffer<float> d_logits(logits.size());
    DeviceBuffer<PenaltyParams> d_params(params.size());
    DeviceBuffer<int32_t> d_rows(entry_rows.size()), d_ids(ids.size()), d_counts(counts.size());
    d_logits.upload(logits, stream.get());
    d_params.upload(params, stream.get());
    d_rows.upload(entry_rows, stream.get());
    d_ids.upload(ids, stream.get());
    d_counts.upload(counts, stream.get());
    apply_penalties(d_logits.get(), vocab, d_params.get(), d_rows.get(), d_ids.get(), d_counts.get(), int64_t(ids.size()), stream.get());
    const std::vector<float> got = d_logits.download(stream.get());
    size_t differing = 0;
    for (size_t i = 0; i < got.size(); ++i) differing += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
    std::printf("penalties: %lld rows × vocab %d, %zu entries, %zu logits differ from the CPU twin\n", (long long)rows, vocab,
                ids.size(), differing);
    EXPECT_EQ(differing, 0u);
  }
}

void check_logprobs(int64_t rows, int vocab, int top_n) {
  const std::vector<float> logits = random_logits(rows, vocab);
  std::vector<int32_t> chosen(static_cast<size_t>(rows));
  for (auto& c : chosen) c = int32_t(rng()() % vocab);
  Stream stream;
  DeviceBuffer<float> d_logits(logits.size()), d_chosen_lp(static_cast<size_t>(rows)), d_top_lp(size_t(std::max<int64_t>(rows * top_n, 1)));
  DeviceBuffer<int32_t> d_chosen(chosen.size()), d_top_ids(size_t(std::max<int64_t>(rows * top_n, 1)));
  d_logits.upload(logits, stream.get());
  d_chosen.upload(chosen, stream.get());
  d_chosen_lp.fill_bytes(0xff, stream.get());
  d_top_lp.fill_bytes(0xff, stream.get());
  d_top_ids.fill_bytes(0xff, stream.get());
  token_logprobs(d_logits.get(), rows, vocab, d_chosen.get(), top_n, d_chosen_lp.get(), d_top_ids.get(), d_top_lp.get(), stream.get());
  const std::vector<float> chosen_lp = d_chosen_lp.download(stream.get()), top_lp = d_top_lp.download(stream.get());
  const std::vector<int32_t> top_ids = d_top_ids.download(stream.get());
  // ~1e-6 by the definition's two summation routes; both infinite (the same sign) also agrees.
  auto close = [](float a, float b) { return (std::isinf(a) && a == b) || std::fabs(a - b) <= 2e-6f + 1e-6f * std::fabs(b); };
  double worst = 0;
  size_t bad_ids = 0, bad_values = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const TokenLogprobs want = logprobs_reference(logits.data() + size_t(r) * vocab, vocab, chosen[size_t(r)], top_n);
    if (!close(chosen_lp[size_t(r)], want.chosen)) ++bad_values;
    if (std::isfinite(want.chosen)) worst = std::max(worst, double(std::fabs(chosen_lp[size_t(r)] - want.chosen)));
    for (int k = 0; k < top_n; ++k) {
      bad_ids += top_ids[size_t(r * top_n + k)] != want.top_ids[size_t(k)];
      if (!close(top_lp[size_t(r * top_n + k)], want.top[size_t(k)])) ++bad_values;
    }
  }
  std::printf("logprobs: %lld rows × vocab %d, top %d: %zu top ids differ, %zu values off, worst |Δ| %.3g\n", (long long)rows, vocab,
              top_n, bad_ids, bad_values, worst);
  EXPECT_EQ(bad_ids, 0u);
  EXPECT_EQ(bad_values, 0u);
}

TEST(TokenLogprobs, MatchesTheCpuTwin) {
  for (int top_n : {0, 1, 5, 20, 32}) check_logprobs(10, 1024, top_n);
  check_logprobs(5, 129280, 20);
}

}  // namespace
}  // namespace dsv4::cuda
