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

// hc_pre's post and comb on their own stream at decode sizes (CudaBackend::comb_branch), joined by the
// ops that read them: a block's chain of hyper-connection ops gives the bits of DSV4_HC_BRANCH=0,
// eager and recorded (outputs poisoned before each replay).
std::vector<float> random_f32(size_t n, float scale) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (auto& e : v) e = d(rng());
  return v;
}

TEST(BackendBranch, HyperConnectionCombBesideTheStream) {
  const int hc = 4, D = 512, iters = 20;
  const int64_t T = 3;
  std::vector<uint16_t> X(size_t(T * hc * D)), y(size_t(T * D));
  std::uniform_int_distribution<int> v(0x3c00, 0x3f80);
  for (auto& e : X) e = uint16_t(v(rng())) | (v(rng()) & 1 ? 0x8000 : 0);
  for (auto& e : y) e = uint16_t(v(rng())) | (v(rng()) & 1 ? 0x8000 : 0);
  const std::vector<float> fn = random_f32(size_t(24) * hc * D, 0.02f), base = random_f32(24, 0.5f),
                           scale = {0.7f, 0.9f, 1.1f};
  // Attention's and the FFN's places taken by scale ops; what the chain leaves: the new state.
  const auto chain = [&](CudaBackend& be, const Tensor& Xt, const Tensor& yt, const HyperConnection& w) {
    Tensor post, comb, Xa;
    Tensor x = be.hc_pre(Xt, w, hc, iters, 1e-6f, 1e-6f, &post, &comb, nullptr);
    Tensor a = be.add(be.scale(x, 0.5f), yt);
    x = be.hc_post_pre(a, Xt, &Xa, w, hc, iters, 1e-6f, 1e-6f, &post, &comb, nullptr);
    return be.hc_post(be.scale(x, 2.0f), Xa, post, comb);
  };
  std::vector<uint16_t> in_line;
  for (const char* mode : {"0", "1"}) {
    setenv("DSV4_HC_BRANCH", mode, 1);
    CudaBackend be;
    unsetenv("DSV4_HC_BRANCH");
    const Tensor Xt = be.from_host(DType::BF16, {T, hc, D}, X.data()), yt = be.from_host(DType::BF16, {T, D}, y.data());
    const Tensor fn_t = be.from_host(DType::F32, {int64_t(fn.size())}, fn.data());
    const Tensor base_t = be.from_host(DType::F32, {24}, base.data()), scale_t = be.from_host(DType::F32, {3}, scale.data());
    const HyperConnection w{fn_t.ptr<float>(), base_t.ptr<float>(), scale_t.ptr<float>()};
    const std::vector<uint16_t> eager = to_host(be, chain(be, Xt, yt, w));
    if (in_line.empty()) {
      in_line = eager;
      continue;
    }
    EXPECT_EQ(eager, in_line) << "eager";
    be.begin_capture();
    Tensor out = chain(be, Xt, yt, w);
    auto recording = be.end_capture();
    for (int r = 0; r < 3; ++r) {
      const std::vector<uint16_t> poison(in_line.size(), 0x7fc1);
      be.upload(out, poison.data());
      be.replay(*recording);
      EXPECT_EQ(to_host(be, out), in_line) << "replay " << r;
    }
    be.synchronize();
  }
}

}  // namespace
}  // namespace dsv4::cuda
