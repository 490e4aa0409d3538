// Tensor parallelism on the CPU backend (docs/ARCHITECTURE.md "Tensor parallelism"), below the
// golden thresholds golden_tp_test holds it to:
//   - tensor-parallel size 1 is the plain model, bit for bit;
//   - the split ops' pieces: linear_partial and moe_expert_partials + moe_combine on unsplit
//     weights give linear and moe_experts exactly; the ranks' shards, summed, give them to within
//     the f32 re-association of their partial sums (at most one bf16 step, on few elements);
//   - every rank of a split model ends a step with the same logits, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "model/make_tiny.h"
#include "model/tensor_parallel_model.h"
#include "test_util.h"

namespace dsv4::test {
namespace {

const std::string kTinyA = test_data_dir(DSV4_TEST_DATA) + "/golden/tiny-a";

std::vector<int32_t> prompt_ids(int n, int seed) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(2 + (seed * 7919 + i * 104729) % 1000);
  return ids;
}

// Prefill logits for every position, then teacher-forced decode logits, of one sequence.
template <typename Model>
std::vector<float> run_sequence(Model& model, const std::vector<int32_t>& prompt, const std::vector<int32_t>& decode) {
  SeqId s = model.new_sequence();
  std::vector<float> logits = model.step({{s, prompt, true}}).logits;
  for (int32_t tok : decode) {
    std::vector<float> row = model.step({{s, {tok}, false}}).logits;
    logits.insert(logits.end(), row.begin(), row.end());
  }
  model.free_sequence(s);
  return logits;
}

TEST(TensorParallel, SizeOneIsThePlainModelBitForBit) {
  CpuBackend backend;
  Dsv4Model plain(load_model_weights(kTinyA, &backend), backend);
  TensorParallelModel tp(kTinyA, "cpu", {1, false});
  const std::vector<int32_t> prompt = prompt_ids(150, 1), decode = {11, 12, 13};
  const std::vector<float> a = run_sequence(plain, prompt, decode), b = run_sequence(tp, prompt, decode);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

Tensor random_bf16(Backend& be, int64_t rows, int64_t cols, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> v(size_t(rows * cols));
  for (auto& x : v) x = f32_to_bf16(normal(rng));
  return be.from_host(DType::BF16, {rows, cols}, v.data());
}

// Columns [c0, c0 + n) of a bf16 [rows, cols] tensor.
Tensor columns(Backend& be, const Tensor& t, int64_t c0, int64_t n) {
  const int64_t rows = t.rows(), cols = t.numel() / rows;
  std::vector<uint16_t> v(size_t(rows * n));
  for (int64_t r = 0; r < rows; ++r) std::memcpy(v.data() + r * n, t.ptr<uint16_t>() + r * cols + c0, size_t(n) * 2);
  return be.from_host(DType::BF16, {rows, n}, v.data());
}

struct BitDiff {
  size_t differ = 0, total = 0;
  int max_ulps = 0;
};
BitDiff bf16_diff(const Tensor& a, const Tensor& b) {
  BitDiff d;
  d.total = size_t(a.numel());
  for (int64_t i = 0; i < a.numel(); ++i) {
    const int x = a.ptr<uint16_t>()[i], y = b.ptr<uint16_t>()[i];
    if (x == y) continue;
    ++d.differ;
    // Same sign: the distance in representable steps; opposite signs count as far apart.
    d.max_ulps = std::max(d.max_ulps, (x ^ y) & 0x8000 ? 1 << 15 : std::abs(x - y));
  }
  return d;
}

// The split ops of one model directory: unsplit pieces exactly, shards summed within one bf16 step.
void check_split_ops(const std::string& dir, bool expert_parallel) {
  CpuBackend be;
  std::mt19937_64 rng(7);
  auto full = load_model_weights(dir, &be);
  const ModelConfig& c = full->config;
  const int world = 2;
  std::vector<std::unique_ptr<ModelWeights>> shards;
  for (int r = 0; r < world; ++r) shards.push_back(load_model_weights(dir, &be, {r, world, expert_parallel}));
  const int64_t T = 37;
  for (size_t l = 0; l < full->blocks.size(); ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const BlockWeights& block = full->blocks[l];
    // Row-parallel wo_b: each rank's input columns, f32 partials summed, rounded once.
    const int64_t cols = int64_t(c.o_groups) * c.o_lora_rank, part = cols / world;
    Tensor z = random_bf16(be, T, cols, rng);
    Tensor want = be.linear(z, block.attn.wo_b);
    EXPECT_EQ(bf16_diff(be.to_bf16(be.linear_partial(z, block.attn.wo_b)), want).differ, 0u) << "linear_partial, unsplit";
    Tensor sum;
    for (int r = 0; r < world; ++r) {
      Tensor p = be.linear_partial(columns(be, z, r * part, part), shards[size_t(r)]->blocks[l].attn.wo_b);
      if (!r) sum = p;
      else
        for (int64_t i = 0; i < sum.numel(); ++i) sum.ptr<float>()[i] += p.ptr<float>()[i];
    }
    BitDiff d = bf16_diff(be.to_bf16(sum), want);
    std::printf("layer %zu wo_b split over %d: %zu of %zu outputs one bf16 step off (max %d)\n", l, world, d.differ, d.total,
                d.max_ulps);
    EXPECT_LE(d.max_ulps, 1);
    EXPECT_LE(d.differ, d.total / 50);

    // MoE: every rank routes alike; the summed partials combined as the unsplit op ends.
    Tensor x = random_bf16(be, T, c.dim, rng);
    std::vector<int32_t> ids = prompt_ids(int(T), int(l));
    Tensor tokens = upload_i32(be, ids);
    Routing route = be.route(x, block.moe, tokens, c.n_active_experts, float(c.route_scale));
    const float limit = float(c.swiglu_limit);
    Tensor moe = be.moe_experts(x, route, block.moe, limit);
    EXPECT_EQ(bf16_diff(be.moe_combine(be.moe_expert_partials(x, route, block.moe, limit), route), moe).differ, 0u)
        << "moe_expert_partials + moe_combine, unsplit";
    Tensor partials;
    for (int r = 0; r < world; ++r) {
      const MoeWeights& m = shards[size_t(r)]->blocks[l].moe;
      Routing rr = be.route(x, m, tokens, c.n_active_experts, float(c.route_scale));
      ASSERT_EQ(std::memcmp(rr.ids.data, route.ids.data, route.ids.nbytes()), 0) << "rank " << r << " routes differently";
      Tensor p = be.moe_expert_partials(x, rr, m, limit);
      if (!r) partials = p;
      else
        for (int64_t i = 0; i < partials.numel(); ++i) partials.ptr<float>()[i] += p.ptr<float>()[i];
    }
    d = bf16_diff(be.moe_combine(partials, route), moe);
    std::printf("layer %zu MoE split over %d (%s): %zu of %zu outputs off, max %d bf16 steps\n", l, world,
                expert_parallel ? "by expert" : "by intermediate", d.differ, d.total, d.max_ulps);
    EXPECT_LE(d.max_ulps, 1);
    EXPECT_LE(d.differ, d.total / 20);
  }
}

TEST(TensorParallel, SplitOpsMxfp4Experts) { check_split_ops(kTinyA, false); }
TEST(TensorParallel, SplitOpsMxfp4ExpertsByExpert) { check_split_ops(kTinyA, true); }
// A synthetic model makes each rank's slices in place (TensorSource::find_window) and every other
// tensor as the unsplit model does: the shards must sum to the unsplit ops as a checkpoint's do.
TEST(TensorParallel, SplitOpsSyntheticModelSlicesMadeInPlace) {
  check_split_ops("synthetic:tiny", false);
  check_split_ops("synthetic:tiny", true);
}
TEST(TensorParallel, SplitOpsBf16Checkpoint) {
  TinyModelOptions o;
  o.out_dir = fresh_dir("tp_bf16_model");
  o.bf16 = true;
  make_tiny_model(o);
  check_split_ops(o.out_dir, false);
  check_split_ops(o.out_dir, true);
}

// After a step every rank holds the same logits: the sums are the same bits everywhere and all
// else is replicated.
TEST(TensorParallel, EveryRankEndsAStepWithTheSameLogits) {
  for (bool ep : {false, true}) {
    TensorParallelModel tp(kTinyA, "cpu", {2, ep});
    const std::vector<int32_t> prompt = prompt_ids(70, 3);
    std::vector<std::vector<float>> logits(2);
    tp.on_every_rank([&](int r) { logits[size_t(r)] = run_sequence(tp.rank_model(r), prompt, {5, 6}); });
    ASSERT_EQ(logits[0].size(), logits[1].size());
    EXPECT_EQ(std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * 4), 0) << (ep ? "expert parallel" : "tensor parallel");
  }
}

// A failure on the ranks reaches the caller, and the model steps on afterwards.
TEST(TensorParallel, AFailedStepIsReportedAndTheNextOneRuns) {
  TensorParallelModel tp(kTinyA, "cpu", {2, false});
  SeqId s = tp.new_sequence();
  EXPECT_THROW(tp.step({{s, {int32_t(tp.config().vocab_size)}, false}}), Error);
  EXPECT_THROW(tp.on_every_rank([](int r) {
    if (r == 1) throw Error("rank 1 fails alone");
  }), Error);
  StepOutput o = tp.step({{s, prompt_ids(10, 4), false}});
  EXPECT_EQ(o.logits.size(), size_t(tp.config().vocab_size));
}

// A failure resets the collectives, and every rank drops its decode recordings and the step it
// planned ahead (they may hold communicators the reset replaced); the steps after it are those of
// a run without the failure, bit for bit.
TEST(TensorParallel, AResetDropsWhatTheRanksRecordedOrPlanned) {
  std::vector<std::vector<float>> logits;
  for (bool fail : {false, true}) {
    TensorParallelModel tp(kTinyA, "cpu", {2, false});
    tp.on_every_rank([&](int r) { tp.rank_model(r).set_decode_graphs(DecodeGraphs::Pad); });
    const SeqId s = tp.new_sequence();
    tp.step({{s, prompt_ids(10, 4)}});
    auto planned = [&](int r) { return tp.rank_model(r).graph_stats().planned_ahead; };
    for (int32_t t : {5, 6, 7}) tp.step({{s, {t}}});
    ASSERT_EQ(planned(0), 2);  // the second and third decode steps were planned during the one before
    if (fail) {
      EXPECT_THROW(tp.on_every_rank([](int r) {
        if (r == 1) throw Error("rank 1 fails alone");
      }), Error);
    }
    StepOutput o = tp.step({{s, {8}}});
    for (int r = 0; r < 2; ++r) EXPECT_EQ(planned(r), fail ? 2 : 3) << "rank " << r << (fail ? ", after a reset" : "");
    logits.push_back(o.logits);
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  EXPECT_EQ(std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * 4), 0);
}

}  // namespace
}  // namespace dsv4::test
