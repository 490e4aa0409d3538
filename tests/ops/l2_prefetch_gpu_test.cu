// L2 prefetch hints (cuda/l2_prefetch.h, CudaBackend::prefetch). A hint has no result to compare
// with a CPU twin; what must hold is that it touches nothing: random ranges (unaligned, empty, at a
// buffer's last byte, expert slices chosen by ids with some outside the table) leave every byte as
// it was and raise no error (compute-sanitizer runs this binary too), and a hint inside a recorded
// step is a branch the recording joins: the replays give the eager step's bits.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/l2_prefetch.h"
#include "gpu_test_rng.h"

namespace dsv4::cuda {
namespace {

std::mt19937& rng() { return test::fresh_rng("l2_prefetch_gpu_test"); }

std::vector<uint8_t> random_bytes(size_t n) {
  std::vector<uint8_t> v(n);
  std::uniform_int_distribution<int> b(0, 255);
  for (auto& x : v) x = uint8_t(b(rng()));
  return v;
}

std::vector<uint8_t> download(const DeviceBuffer<uint8_t>& d) {
  std::vector<uint8_t> v(d.size());
  DSV4_CUDA_CHECK(cudaMemcpy(v.data(), d.get(), d.size(), cudaMemcpyDeviceToHost));
  return v;
}

TEST(L2Prefetch, RangesTouchNothing) {
  for (int rep = 0; rep < 4; ++rep) {
    const size_t n = (size_t(3) << 20) + std::uniform_int_distribution<size_t>(0, 4095)(rng());
    const std::vector<uint8_t> host = random_bytes(n);
    DeviceBuffer<uint8_t> buf(n);
    buf.upload(host.data(), n);
    std::uniform_int_distribution<size_t> at(0, n - 1);
    std::vector<PrefetchRange> ranges;
    ranges.push_back({buf.get() + n - 1, 1});        // the last byte alone: nothing left after trimming
    ranges.push_back({buf.get(), n});                // the whole buffer
    ranges.push_back({nullptr, 100});                // skipped
    ranges.push_back({buf.get() + 5, 0});            // empty
    while (ranges.size() < size_t(kMaxPrefetchRanges)) {
      const size_t a = at(rng()), b = at(rng());
      ranges.push_back({buf.get() + std::min(a, b), std::max(a, b) - std::min(a, b) + 1});
    }
    Stream s;
    l2_prefetch(ranges.data(), int(ranges.size()), s.get());
    s.sync();
    DSV4_CUDA_CHECK(cudaGetLastError());
    EXPECT_EQ(download(buf), host);
  }
}

TEST(L2Prefetch, ExpertSlicesByIds) {
  const int experts = 7;
  const size_t strides[2] = {size_t(96) << 10, size_t(6) << 10};
  std::vector<std::vector<uint8_t>> host;
  std::vector<DeviceBuffer<uint8_t>> tables;
  for (size_t stride : strides) {
    host.push_back(random_bytes(stride * experts));
    tables.emplace_back(stride * experts);
    tables.back().upload(host.back().data(), host.back().size());
  }
  std::uniform_int_distribution<int> id(-2, experts + 1);
  for (int n : {1, 6, 40}) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (auto& v : ids) v = id(rng());
    ids[0] = experts - 1;  // the last slice, to its end
    DeviceBuffer<int32_t> d_ids(ids.size());
    d_ids.upload(ids.data(), ids.size());
    ExpertPrefetch e{};
    e.tables = 2;
    for (int t = 0; t < 2; ++t) {
      e.base[t] = tables[size_t(t)].get();
      e.stride[t] = strides[t];
      e.bytes[t] = n == 1 ? strides[t] : (strides[t] / 3) & ~size_t(15);
    }
    Stream s;
    l2_prefetch_experts(d_ids.get(), n, experts, e, s.get());
    s.sync();
    DSV4_CUDA_CHECK(cudaGetLastError());
    for (int t = 0; t < 2; ++t) EXPECT_EQ(download(tables[size_t(t)]), host[size_t(t)]) << "table " << t << ", " << n << " ids";
  }
}

TEST(L2Prefetch, HintInsideARecordedStep) {
  setenv("DSV4_L2_PREFETCH_MB", "8", 1);
  CudaBackend be;
  unsetenv("DSV4_L2_PREFETCH_MB");
  const int64_t rows = 3, width = 4096;
  std::vector<uint16_t> x(size_t(rows * width));
  std::uniform_int_distribution<int> v(0x3c00, 0x4000);  // bf16 values in [0.0078, 2]
  for (auto& e : x) e = uint16_t(v(rng()));
  const std::vector<uint8_t> weight = random_bytes(size_t(12) << 20);  // more than the budget
  const void* placed = be.place_weight(weight.data(), weight.size());
  Tensor in = be.from_host(DType::BF16, {rows, width}, x.data());
  // The step: two ops with a hint between them (the second reads what the first wrote).
  auto step = [&] {
    Tensor a = be.scale(in, 0.5f);
    be.prefetch({{placed, weight.size()}, {nullptr, 0}});
    return be.scale(a, 3.0f);
  };
  std::vector<uint16_t> eager(x.size()), replayed(x.size());
  be.to_host(step(), eager.data());
  Tensor out;
  be.begin_capture();
  out = step();
  auto recording = be.end_capture();
  for (int r = 0; r < 3; ++r) {
    std::vector<uint16_t> poison(x.size(), 0x7fc1);
    be.upload(out, poison.data());
    be.replay(*recording);
    be.to_host(out, replayed.data());
    EXPECT_EQ(replayed, eager) << "replay " << r;
  }
  be.synchronize();
  std::vector<uint8_t> back(weight.size());
  DSV4_CUDA_CHECK(cudaMemcpy(back.data(), placed, back.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, weight);
}

}  // namespace
}  // namespace dsv4::cuda
