// The in-process communicator (backend/cpu/in_process_communicator.h): ranks are threads, each
// with its own CPU backend. Fresh random inputs on every run (the seed is printed), outputs
// poisoned beforehand, and every rank must end with the identical bits of the rank-order sum.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/in_process_communicator.h"

namespace dsv4 {
namespace {

uint64_t fresh_seed() {
  const uint64_t seed = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  std::printf("seed %llu\n", (unsigned long long)seed);
  return seed;
}

// Runs fn(rank) on `world` threads at once; a failing rank aborts the group (as the runner does).
void on_ranks(CommunicatorGroup& group, const std::function<void(int)>& fn, std::vector<std::string>* errors = nullptr) {
  const int world = int(group.ranks.size());
  std::vector<std::thread> threads;
  std::vector<std::string> err(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        err[size_t(r)] = e.what();
        group.abort();
      }
    });
  for (auto& t : threads) t.join();
  group.reset();
  if (errors) *errors = err;
  else
    for (int r = 0; r < world; ++r) EXPECT_EQ(err[size_t(r)], "") << "rank " << r;
}

std::vector<float> random_floats(std::mt19937_64& rng, size_t n) {
  // Magnitudes over many binades, so the order of the additions shows in the bits.
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<float> v(n);
  for (auto& x : v) x = std::ldexp(normal(rng), exponent(rng));
  return v;
}

class InProcessCommunicatorTest : public ::testing::TestWithParam<int> {};

TEST_P(InProcessCommunicatorTest, AllReduceSumIsTheRankOrderSumOnEveryRank) {
  const int world = GetParam();
  std::mt19937_64 rng(fresh_seed());
  CommunicatorGroup group = make_in_process_group(world);
  std::vector<CpuBackend> backends(static_cast<size_t>(world));
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(4099)}) {  // fewer elements than ranks, uneven shares
      std::vector<std::vector<float>> inputs;
      for (int r = 0; r < world; ++r) {
        inputs.push_back(random_floats(rng, size_t(n)));
        if (dtype == DType::BF16)
          for (auto& x : inputs.back()) x = round_bf16(x);
      }
      std::vector<Tensor> x(static_cast<size_t>(world));
      for (int r = 0; r < world; ++r) {
        x[size_t(r)] = backends[size_t(r)].alloc(dtype, {n});
        for (int64_t i = 0; i < n; ++i) {
          if (dtype == DType::F32) x[size_t(r)].ptr<float>()[i] = inputs[size_t(r)][size_t(i)];
          else x[size_t(r)].ptr<uint16_t>()[i] = f32_to_bf16(inputs[size_t(r)][size_t(i)]);
        }
      }
      on_ranks(group, [&](int r) { group.ranks[size_t(r)]->all_reduce_sum(x[size_t(r)]); });
      for (int64_t i = 0; i < n; ++i) {
        float want = inputs[0][size_t(i)];
        for (int r = 1; r < world; ++r) want += inputs[size_t(r)][size_t(i)];
        for (int r = 0; r < world; ++r) {
          if (dtype == DType::F32) {
            const float got = x[size_t(r)].ptr<float>()[i];
            ASSERT_EQ(std::memcmp(&got, &want, 4), 0) << "rank " << r << " element " << i << ": " << got << " vs " << want;
          } else {
            ASSERT_EQ(x[size_t(r)].ptr<uint16_t>()[i], f32_to_bf16(want)) << "rank " << r << " element " << i;
          }
        }
      }
    }
  }
}

TEST_P(InProcessCommunicatorTest, AllGatherAndBroadcastFillPoisonedOutputs) {
  const int world = GetParam();
  std::mt19937_64 rng(fresh_seed());
  CommunicatorGroup group = make_in_process_group(world);
  std::vector<CpuBackend> backends(static_cast<size_t>(world));
  const int64_t rows = 3, cols = 5;
  std::vector<Tensor> x(static_cast<size_t>(world)), out(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const std::vector<float> v = random_floats(rng, size_t(rows * cols));
    x[size_t(r)] = backends[size_t(r)].from_host(DType::F32, {rows, cols}, v.data());
    out[size_t(r)] = backends[size_t(r)].alloc(DType::F32, {world * rows, cols});
    std::memset(out[size_t(r)].data, 0xff, out[size_t(r)].nbytes());  // NaN everywhere
  }
  on_ranks(group, [&](int r) { group.ranks[size_t(r)]->all_gather(x[size_t(r)], out[size_t(r)]); });
  for (int r = 0; r < world; ++r)
    for (int s = 0; s < world; ++s)
      EXPECT_EQ(std::memcmp(out[size_t(r)].ptr<float>() + s * rows * cols, x[size_t(s)].data, x[size_t(s)].nbytes()), 0)
          << "rank " << r << " piece " << s;

  const int root = world - 1;
  std::vector<uint8_t> want(x[size_t(root)].nbytes());
  std::memcpy(want.data(), x[size_t(root)].data, want.size());
  for (int r = 0; r < world; ++r)
    if (r != root) std::memset(x[size_t(r)].data, 0xff, x[size_t(r)].nbytes());
  on_ranks(group, [&](int r) { group.ranks[size_t(r)]->broadcast(x[size_t(r)], root); });
  for (int r = 0; r < world; ++r) EXPECT_EQ(std::memcmp(x[size_t(r)].data, want.data(), want.size()), 0) << "rank " << r;
}

TEST_P(InProcessCommunicatorTest, MismatchedShapesFailOnEveryRank) {
  const int world = GetParam();
  if (world == 1) GTEST_SKIP() << "one rank has no one to disagree with";
  CommunicatorGroup group = make_in_process_group(world);
  std::vector<CpuBackend> backends(static_cast<size_t>(world));
  std::vector<Tensor> x;
  for (int r = 0; r < world; ++r) x.push_back(backends[size_t(r)].alloc(DType::F32, {r == 1 ? 5 : 4}));
  std::vector<std::string> errors;
  on_ranks(group, [&](int r) { group.ranks[size_t(r)]->all_reduce_sum(x[size_t(r)]); }, &errors);
  for (int r = 0; r < world; ++r) EXPECT_NE(errors[size_t(r)].find("collective mismatch"), std::string::npos) << errors[size_t(r)];
}

TEST_P(InProcessCommunicatorTest, ARankThatFailsReleasesTheOthers) {
  const int world = GetParam();
  if (world == 1) GTEST_SKIP() << "one rank waits for no one";
  CommunicatorGroup group = make_in_process_group(world);
  std::vector<CpuBackend> backends(static_cast<size_t>(world));
  std::vector<Tensor> x;
  for (int r = 0; r < world; ++r) x.push_back(backends[size_t(r)].alloc(DType::F32, {8}));
  std::vector<std::string> errors;
  on_ranks(group, [&](int r) {
    if (r == 0) throw Error("rank 0 failed before the collective");
    group.ranks[size_t(r)]->all_reduce_sum(x[size_t(r)]);
  }, &errors);
  EXPECT_EQ(errors[0], "rank 0 failed before the collective");
  for (int r = 1; r < world; ++r) EXPECT_NE(errors[size_t(r)].find("another rank failed"), std::string::npos) << errors[size_t(r)];
  // After reset the group works again.
  for (auto& t : x) std::fill_n(t.ptr<float>(), 8, 1.0f);
  on_ranks(group, [&](int r) { group.ranks[size_t(r)]->all_reduce_sum(x[size_t(r)]); });
  for (auto& t : x) EXPECT_EQ(t.ptr<float>()[7], float(world));
}

INSTANTIATE_TEST_SUITE_P(Ranks, InProcessCommunicatorTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

}  // namespace
}  // namespace dsv4
