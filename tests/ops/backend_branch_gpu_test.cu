// Backend branches on the CUDA backend (Backend::branch_begin / branch_end / branch_join): work on
// the side stream beside the stream, joined, gives the bits of the same ops in line — eager, and
// recorded and replayed (the branch is then a branch of the graph). Fresh random inputs; the
// recording's output is poisoned before each replay. And the traced replay of such a recording
// (Backend::trace_replays, through CUPTI) with the profiling backend's record of which op call made
// which items: every item of every replay comes back once, under its recorded name, with its start
// before its end; the op calls' item ranges cover the recording in call order; and a traced replay
// still computes what the step computes. And moe_begin's branch (the shared expert before the router).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_graph.h"
#include "backend/profiling_backend.h"
#include "model/weights.h"
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

// moe_begin (the shared expert started on the branch before the router) changes nothing moe_experts
// returns: taken by the moe_experts of the same x, eager and recorded; begun for another x (not
// taken: joined and dropped), and not begun at all. A fixture-shaped random model's MoE layers
// (learned and hash routing), decode rows, fresh random inputs.
TEST(MoeBegin, SharedExpertBesideTheRouterAsInLine) {
  CudaBackend be;
  const std::unique_ptr<ModelWeights> w = load_model_weights("synthetic:tiny,seed=" + std::to_string(rng()() % 1000), &be);
  const ModelConfig& c = w->config;
  const int D = c.dim, k = c.n_active_experts;
  const float limit = float(c.swiglu_limit), scale = float(c.route_scale);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> token(0, c.vocab_size - 1);
  for (const BlockWeights& block : {w->blocks.front(), w->blocks.back()})
    for (int64_t T : {1, 3}) {
      std::vector<uint16_t> xs(static_cast<size_t>(T * D)), other(static_cast<size_t>(T * D));
      for (auto& v : xs) v = f32_to_bf16(nd(rng()));
      for (auto& v : other) v = f32_to_bf16(nd(rng()));
      std::vector<int32_t> ids(static_cast<size_t>(T));
      for (auto& t : ids) t = token(rng());
      const Tensor x = be.from_host(DType::BF16, {T, D}, xs.data()), y = be.from_host(DType::BF16, {T, D}, other.data());
      const Tensor tokens = be.from_host(DType::I32, {T}, ids.data());
      const auto moe = [&](const Tensor* begin_with) {
        if (begin_with) be.moe_begin(*begin_with, block.moe, limit);
        const Routing r = be.route(x, block.moe, tokens, k, scale);
        return be.moe_experts(x, r, block.moe, limit);
      };
      const std::string what = "layer " + std::to_string(block.layer) + ", " + std::to_string(T) + " rows";
      const std::vector<uint16_t> in_line = to_host(be, moe(nullptr));
      EXPECT_EQ(to_host(be, moe(&x)), in_line) << what << ": begun";
      EXPECT_EQ(to_host(be, moe(&y)), in_line) << what << ": begun for another x";
      be.begin_capture();
      Tensor out = moe(&x);
      auto recording = be.end_capture();
      for (int r = 0; r < 2; ++r) {
        const std::vector<uint16_t> poison(in_line.size(), 0x7fc1);
        be.upload(out, poison.data());
        be.replay(*recording);
        EXPECT_EQ(to_host(be, out), in_line) << what << ": begun, replay " << r;
      }
      be.synchronize();
    }
}

TEST(ReplayTrace, EveryItemOfEveryReplayOnceWithItsOp) {
  const int64_t rows = 7, width = 4096;
  std::vector<uint16_t> x(size_t(rows * width));
  std::uniform_int_distribution<int> v(0x3c00, 0x4100);
  for (auto& e : x) e = uint16_t(v(rng()));
  ProfilingBackend be(std::make_unique<CudaBackend>());
  Tensor xt = be.from_host(DType::BF16, {rows, width}, x.data());
  const std::vector<uint16_t> eager = to_host(be, step(be, xt));

  be.begin_capture();
  Tensor out = step(be, xt);
  auto work = be.end_capture();
  const auto& ops = be.recorded_ops();
  ASSERT_EQ(ops.size(), 6u);
  const char* names[] = {"scale", "scale", "add", "scale", "scale", "add"};
  int64_t next = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    EXPECT_EQ(ops[i].op, names[i]) << i;
    EXPECT_EQ(ops[i].from, next) << i;
    EXPECT_GT(ops[i].to, ops[i].from) << i;
    next = ops[i].to;
  }
  const auto* graph = dynamic_cast<const CudaGraph*>(work.get());
  ASSERT_NE(graph, nullptr);
  const std::vector<std::string> item_names = graph->item_names();
  EXPECT_EQ(int64_t(item_names.size()), work->items());
  EXPECT_LE(next, work->items());  // the join's event nodes, if any, belong to no op

  const std::vector<uint16_t> poison(eager.size(), 0x7fc1);
  be.upload(out, poison.data());
  std::string why_not;
  const int replays = 4;
  const auto traces = be.trace_replays(*work, replays, why_not);
  ASSERT_EQ(traces.size(), size_t(replays)) << why_not;
  EXPECT_EQ(to_host(be, out), eager);
  for (int r = 0; r < replays; ++r) {
    std::vector<int64_t> seen;
    for (const auto& it : traces[size_t(r)]) {
      ASSERT_GE(it.item, 0);
      ASSERT_LT(it.item, int64_t(item_names.size()));
      EXPECT_EQ(it.name, item_names[size_t(it.item)]) << "replay " << r << " item " << it.item;
      EXPECT_LE(it.start_us, it.end_us);
      EXPECT_GE(it.start_us, 0.0);
      seen.push_back(it.item);
    }
    std::sort(seen.begin(), seen.end());
    EXPECT_TRUE(std::adjacent_find(seen.begin(), seen.end()) == seen.end()) << "an item twice in replay " << r;
    // Every op call's items ran (kernels here: one an op).
    for (const auto& op : ops)
      for (int64_t i = op.from; i < op.to; ++i)
        EXPECT_TRUE(std::binary_search(seen.begin(), seen.end(), i)) << op.op << " item " << i << " replay " << r;
  }
  be.synchronize();
}

}  // namespace
}  // namespace dsv4::cuda
