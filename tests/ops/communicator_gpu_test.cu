// The CUDA backends' communicators (backend/cuda/nccl_communicator.h, backend/host_staged_communicator.h)
// against sums made on the host: NCCL with a rank per visible GPU (up to 2; one GPU makes a group
// of one), its collectives inside a recorded step, abort and reset; the host-staged group with two
// ranks sharing GPU 0. Fresh random inputs each run, outputs poisoned before every collective.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "backend/communicator.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/nccl_communicator.h"

namespace dsv4 {
namespace {

std::mt19937& rng() {
  static std::mt19937 r(std::random_device{}());
  return r;
}

std::vector<float> random_floats(size_t n) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng());
  return v;
}

// Runs fn(rank) on a fresh thread per rank whose current device is the rank's GPU (a backend is
// used only from threads whose current device is its own: backend/cuda/cuda_backend.h).
void on_ranks(const std::vector<int>& gpus, const std::function<void(int)>& fn) {
  const int world = int(gpus.size());
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        DSV4_CUDA_CHECK(cudaSetDevice(gpus[size_t(r)]));
        fn(r);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

int visible_gpus() {
  int n = 0;
  DSV4_CUDA_CHECK(cudaGetDeviceCount(&n));
  return n;
}

struct Ranks {
  std::vector<int> gpus;  // each rank's
  std::vector<std::unique_ptr<cuda::CudaBackend>> backends;
  CommunicatorGroup group;
};

// A backend per rank on `gpus[r]` (made on the rank's thread), then the group over them.
Ranks make_ranks(const std::vector<int>& gpus) {
  Ranks out;
  out.gpus = gpus;
  out.backends.resize(gpus.size());
  on_ranks(gpus, [&](int r) { out.backends[size_t(r)] = std::make_unique<cuda::CudaBackend>(gpus[size_t(r)]); });
  std::vector<Backend*> bs;
  for (auto& b : out.backends) bs.push_back(b.get());
  out.group = make_communicator_group(bs);
  return out;
}

// all_reduce_sum, all_gather and broadcast on every rank against the host's results; with
// `record`, the all-reduce runs inside a recorded step, replayed twice on fresh inputs.
void check_collectives(Ranks& ranks, bool record) {
  const int world = int(ranks.backends.size());
  const int64_t n = 1 + int64_t(rng()() % 70000);
  std::vector<std::vector<float>> inputs(static_cast<size_t>(world));
  for (auto& v : inputs) v = random_floats(size_t(n));
  std::vector<float> sum(size_t(n), 0.f);
  for (int64_t i = 0; i < n; ++i) {
    float s = inputs[0][size_t(i)];
    for (int r = 1; r < world; ++r) s += inputs[size_t(r)][size_t(i)];
    sum[size_t(i)] = s;
  }
  const int root = int(rng()() % unsigned(world));
  on_ranks(ranks.gpus, [&](int r) {
    cuda::CudaBackend& be = *ranks.backends[size_t(r)];
    Communicator& comm = *ranks.group.ranks[size_t(r)];
    ASSERT_EQ(comm.rank(), r);
    ASSERT_EQ(comm.world_size(), world);
    Tensor x = be.from_host(DType::F32, {n}, inputs[size_t(r)].data());
    if (record && comm.can_record()) {
      Tensor y = be.alloc(DType::F32, {n});
      be.begin_capture();
      be.copy_rows(x, 0, y, 0, n);
      comm.all_reduce_sum(y);
      std::unique_ptr<CapturedWork> work = be.end_capture();
      for (int replay = 0; replay < 2; ++replay) {
        std::vector<float> poison(size_t(n), std::numeric_limits<float>::quiet_NaN());
        be.upload(y, poison.data());
        be.replay(*work);
        std::vector<float> got(static_cast<size_t>(n));
        be.to_host(y, got.data());
        EXPECT_EQ(std::memcmp(got.data(), sum.data(), got.size() * 4), 0) << "rank " << r << ", replay " << replay;
      }
    } else {
      comm.all_reduce_sum(x);
      std::vector<float> got(static_cast<size_t>(n));
      be.to_host(x, got.data());
      EXPECT_EQ(std::memcmp(got.data(), sum.data(), got.size() * 4), 0) << "all-reduce, rank " << r;
    }
    Tensor mine = be.from_host(DType::F32, {n}, inputs[size_t(r)].data());
    Tensor gathered = be.alloc(DType::F32, {world * n});
    std::vector<float> poison(size_t(world * n), std::numeric_limits<float>::quiet_NaN());
    be.upload(gathered, poison.data());
    comm.all_gather(mine, gathered);
    std::vector<float> got(size_t(world * n));
    be.to_host(gathered, got.data());
    for (int q = 0; q < world; ++q)
      EXPECT_EQ(std::memcmp(got.data() + size_t(q) * n, inputs[size_t(q)].data(), size_t(n) * 4), 0)
          << "all-gather, rank " << r << ", part " << q;
    comm.broadcast(mine, root);
    std::vector<float> b(static_cast<size_t>(n));
    be.to_host(mine, b.data());
    EXPECT_EQ(std::memcmp(b.data(), inputs[size_t(root)].data(), size_t(n) * 4), 0) << "broadcast from " << root << ", rank " << r;
  });
}

std::vector<int> nccl_gpus() {
  std::vector<int> gpus;
  for (int g = 0; g < std::min(2, visible_gpus()); ++g) gpus.push_back(g);
  return gpus;
}

TEST(NcclCommunicator, CollectivesMatchTheHost) {
  if (const std::string why = cuda::nccl_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  Ranks ranks = make_ranks(nccl_gpus());
  std::printf("NCCL %s, %zu rank(s)\n", cuda::nccl_version().c_str(), ranks.backends.size());
  for (int i = 0; i < 3; ++i) check_collectives(ranks, false);
}

TEST(NcclCommunicator, AllReduceInARecordedStep) {
  if (const std::string why = cuda::nccl_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  Ranks ranks = make_ranks(nccl_gpus());
  ASSERT_TRUE(ranks.group.ranks[0]->can_record());
  check_collectives(ranks, true);
}

TEST(NcclCommunicator, AbortEndsTheGroupAndResetRestoresIt) {
  if (const std::string why = cuda::nccl_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  Ranks ranks = make_ranks(nccl_gpus());
  ranks.group.abort();
  on_ranks(ranks.gpus, [&](int r) {
    Tensor x = ranks.backends[size_t(r)]->alloc(DType::F32, {16});
    EXPECT_THROW(ranks.group.ranks[size_t(r)]->all_reduce_sum(x), CollectiveAborted) << "rank " << r;
  });
  ranks.group.reset();
  check_collectives(ranks, false);
}

TEST(NcclCommunicator, RefusesRanksSharingAGpu) {
  if (const std::string why = cuda::nccl_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  cuda::CudaBackend a(0), b(0);
  EXPECT_THROW(cuda::make_nccl_group({&a, &b}), Error);
}

// Ranks on one GPU: what make_communicator_group gives them (host-staged, not recordable).
TEST(HostStagedCommunicator, TwoRanksOnOneGpu) {
  Ranks ranks = make_ranks({0, 0});
  EXPECT_FALSE(ranks.group.ranks[0]->can_record());
  for (int i = 0; i < 3; ++i) check_collectives(ranks, false);
}

}  // namespace
}  // namespace dsv4
