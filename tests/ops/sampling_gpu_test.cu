// The GPU sampler (backend/cuda/sampling.h) against its CPU twin sample_reference: token for token.
// The definition uses integer masses and a deterministic exp, so no tolerance is needed — every
// mismatch is a failure. Rows mix greedy, temperature, top-k, top-p and min-p, with planted ties,
// −inf and NaN logits and bf16-quantised rows (many equal logits); outputs poisoned first.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/cpu/sampling_reference.h"
#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/sampling.h"
#include "core/dtypes.h"
#include "gpu_test_rng.h"

namespace dsv4::cuda {
namespace {

std::mt19937& rng() { return test::fresh_rng("sampling_gpu_test"); }

struct Batch {
  std::vector<float> logits;
  std::vector<SamplingParams> params;
  std::vector<uint64_t> counters;
};

Batch random_batch(int64_t rows, int vocab, bool greedy_only) {
  Batch b;
  b.logits.resize(size_t(rows) * vocab);
  b.params.resize(size_t(rows));
  b.counters.resize(size_t(rows));
  const float sigmas[] = {0.5f, 2.f, 5.f};
  const float temps[] = {0.f, 0.3f, 0.7f, 1.f, 1.5f};
  const int top_ks[] = {0, 0, 1, 5, 50, 1000};
  const float top_ps[] = {1.f, 1.f, 0.95f, 0.5f, 1e-9f};
  const float min_ps[] = {0.f, 0.f, 0.05f, 0.5f};
  auto pick = [](const auto& options) { return options[rng()() % (sizeof(options) / sizeof(options[0]))]; };
  const float inf = INFINITY;
  for (int64_t r = 0; r < rows; ++r) {
    float* l = b.logits.data() + size_t(r) * vocab;
    std::normal_distribution<float> nd(0.f, pick(sigmas));
    const int style = int(r % 6);
    for (int i = 0; i < vocab; ++i) {
      l[i] = nd(rng());
      if (style == 1) l[i] = bf16_to_f32(f32_to_bf16(l[i]));  // coarse: many exact ties
      if (style == 2 && i % 7 == 0) l[i] = -inf;
      if (style == 3 && i % 11 == 0) l[i] = std::nanf("");
    }
    if (style == 4) l[rng()() % vocab] = l[rng()() % vocab] = 30.f;  // tie at the maximum
    SamplingParams& sp = b.params[size_t(r)];
    sp.temperature = greedy_only ? 0.f : pick(temps);
    sp.top_k = pick(top_ks);
    sp.top_p = pick(top_ps);
    sp.min_p = pick(min_ps);
    sp.seed = (uint64_t(rng()()) << 32) | rng()();
    b.counters[size_t(r)] = rng()() % 5000;
  }
  return b;
}

std::vector<int32_t> run_gpu(const Batch& b, int64_t rows, int vocab, int64_t first_row = 0) {
  Stream stream;
  DeviceBuffer<float> d_logits(size_t(rows) * vocab);
  DeviceBuffer<SamplingParams> d_params(static_cast<size_t>(rows));
  DeviceBuffer<uint64_t> d_counters(static_cast<size_t>(rows));
  DeviceBuffer<int32_t> d_out(static_cast<size_t>(rows));
  DeviceBuffer<uint8_t> d_ws(sampling_workspace_bytes(rows, vocab));
  d_logits.upload(b.logits.data() + size_t(first_row) * vocab, size_t(rows) * vocab, stream.get());
  d_params.upload(b.params.data() + first_row, size_t(rows), stream.get());
  d_counters.upload(b.counters.data() + first_row, size_t(rows), stream.get());
  d_out.fill_bytes(0xff, stream.get());
  d_ws.fill_bytes(0xff, stream.get());
  sample_tokens(d_logits.get(), rows, vocab, d_params.get(), d_counters.get(), d_out.get(), d_ws.get(), stream.get());
  return d_out.download(stream.get());
}

void check(int64_t rows, int vocab, bool greedy_only = false) {
  const Batch b = random_batch(rows, vocab, greedy_only);
  std::vector<int32_t> want(static_cast<size_t>(rows));
  sample_reference(b.logits.data(), rows, vocab, b.params.data(), b.counters.data(), want.data());
  const std::vector<int32_t> got = run_gpu(b, rows, vocab);
  size_t mismatches = 0, greedy_rows = 0;
  for (int64_t r = 0; r < rows; ++r) {
    greedy_rows += !(b.params[size_t(r)].temperature > 0);
    if (got[size_t(r)] != want[size_t(r)]) {
      if (mismatches < 5)
        std::printf("  row %lld: GPU %d, CPU %d (T %g top_k %d top_p %g min_p %g)\n", (long long)r, got[size_t(r)],
                    want[size_t(r)], b.params[size_t(r)].temperature, b.params[size_t(r)].top_k, b.params[size_t(r)].top_p,
                    b.params[size_t(r)].min_p);
      ++mismatches;
    }
  }
  // Same batch again, and its last row alone: the same tokens.
  const std::vector<int32_t> again = run_gpu(b, rows, vocab);
  const std::vector<int32_t> alone = run_gpu(b, 1, vocab, rows - 1);
  std::printf("sample %lld rows × vocab %d: %zu greedy rows, %zu mismatches, rerun %s, last row alone %s\n",
              (long long)rows, vocab, greedy_rows, mismatches, again == got ? "identical" : "DIFFERS",
              alone[0] == got[size_t(rows - 1)] ? "identical" : "DIFFERS");
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(again, got);
  EXPECT_EQ(alone[0], got[size_t(rows - 1)]);
}

TEST(SampleTokens, FixtureVocab) {
  for (int64_t rows : {1, 4, 33, 256}) check(rows, 1024);
  check(64, 1024, true);
}

TEST(SampleTokens, FlashVocab) {
  for (int64_t rows : {1, 8}) check(rows, 129280);
  check(4, 129280, true);
}

TEST(SampleTokensSanitizer, Small) {
  check(3, 1000);
  check(2, 300, true);
}

}  // namespace
}  // namespace dsv4::cuda
