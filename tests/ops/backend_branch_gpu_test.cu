// Backend branches on the CUDA backend (Backend::branch_begin / branch_end / branch_join): work on
// the side stream beside the stream, joined, gives the bits of the same ops in line — eager, and
// recorded and replayed (the branch is then a branch of the graph). Fresh random inputs; the
// recording's output is poisoned before each replay.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "gpu_test_rng.h"

namespace dsv4::cuda {
namespace {

std::mt19937& rng() { return test::fresh_rng("backend_branch_gpu_test"); }

std::vector<uint16_t> to_host(Backend& be, const Tensor& t) {
  std::vector<uint16_t> v(size_t(t.numel()));
  be.to_host(t, v.data());
  return v;
}

// Main: a = 0.5·x, d = 2·a; branch: c = 3·x + x; then c + d. Each side reads only x and its own.
Tensor step(Backend& be, const Tensor& x) {
  Tensor a = be.scale(x, 0.5f);
  be.branch_begin();
  Tensor b = be.scale(x, 3.0f);
  Tensor c = be.add(b, x);
  be.branch_end();
  Tensor d = be.scale(a, 2.0f);
  Tensor e = be.scale(d, 1.5f);
  be.branch_join();  // b, c alive until here
  return be.add(c, e);
}

TEST(BackendBranch, BesideTheStreamAsInLine) {
  const int64_t rows = 5, width = 3000;
  std::vector<uint16_t> x(size_t(rows * width));
  std::uniform_int_distribution<int> v(0x3c00, 0x4100);  // bf16 in [0.0078, 8)
  for (auto& e : x) e = uint16_t(v(rng())) | (v(rng()) & 1 ? 0x8000 : 0);

  setenv("DSV4_BRANCHES", "0", 1);
  std::vector<uint16_t> in_line;
  {
    CudaBackend be;
    in_line = to_host(be, step(be, be.from_host(DType::BF16, {rows, width}, x.data())));
  }
  setenv("DSV4_BRANCHES", "1", 1);
  CudaBackend be;
  unsetenv("DSV4_BRANCHES");
  Tensor xt = be.from_host(DType::BF16, {rows, width}, x.data());
  for (int r = 0; r < 3; ++r) EXPECT_EQ(to_host(be, step(be, xt)), in_line) << "eager " << r;

  be.begin_capture();
  Tensor out = step(be, xt);
  auto recording = be.end_capture();
  for (int r = 0; r < 3; ++r) {
    const std::vector<uint16_t> poison(in_line.size(), 0x7fc1);
    be.upload(out, poison.data());
    be.replay(*recording);
    EXPECT_EQ(to_host(be, out), in_line) << "replay " << r;
  }
  be.synchronize();
}

}  // namespace
}  // namespace dsv4::cuda
