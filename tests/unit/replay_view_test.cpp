// The profile's view of a traced replay (commands/op_profile.h replay_view): each item's share is
// how far it moved the step's end, so overlapped work counts once, gaps go to the item that ends
// after them, and the shares add up to the step; items are attributed to the op call that made them.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "commands/op_profile.h"

namespace dsv4::commands {
namespace {

// Two layers (SWA, CSA); items 0 and 1 in a chain (1 launched early, waiting), item 2 on a branch,
// item 3 after a gap and made by no op call.
struct Example {
  ModelConfig c;
  std::vector<CapturedWork::TracedItem> replay = {{0, "k0", 100, 110}, {1, "k1", 102, 115}, {2, "k2", 103, 112},
                                                  {3, "k3", 120, 125}};
  std::vector<ProfilingBackend::RecordedOp> ops = {{"a", 0, 0, 1}, {"b", 0, 1, 2}, {"c", 1, 2, 3}};
  Example() {
    c.n_layers = 2;
    c.compress_ratios = {0, 4};
  }
};

TEST(ReplayView, SharesMoveTheEndAndAddUpToTheStep) {
  const Example x;
  const ReplayView v = replay_view({x.replay, x.replay}, x.ops, x.c);
  ASSERT_TRUE(v.traced);
  EXPECT_EQ(v.replays, 2);
  EXPECT_DOUBLE_EQ(v.step_us, 25);
  EXPECT_DOUBLE_EQ(v.op_us.at({"a", "SWA"}), 10);
  EXPECT_DOUBLE_EQ(v.op_us.at({"c", "CSA"}), 2);
  EXPECT_DOUBLE_EQ(v.op_us.at({"b", "SWA"}), 3);
  EXPECT_DOUBLE_EQ(v.unattributed_us, 10);
  EXPECT_DOUBLE_EQ(v.region_us.at(0), 13);
  EXPECT_DOUBLE_EQ(v.region_us.at(1), 2);
  EXPECT_DOUBLE_EQ(v.op_region_us.at({"a", 0}), 10);
  EXPECT_DOUBLE_EQ(v.op_region_us.at({"c", 1}), 2);
  double total = v.unattributed_us;
  for (const auto& [key, us] : v.op_us) total += us;
  EXPECT_DOUBLE_EQ(total, v.step_us);
  ASSERT_EQ(v.kernels.size(), 4u);
  EXPECT_EQ(v.kernels[0].name, "k0");  // 10 µs, then k3 (10: the gap), k1 (3), k2 (2)
  EXPECT_EQ(v.kernels[3].name, "k2");
  EXPECT_EQ(v.kernels[0].calls, 1);
  EXPECT_DOUBLE_EQ(v.kernels[3].busy_us, 9);
}

// DeepSeek-V4-Flash's step from the replay's layer shares: each kind's mean layer times its count.
TEST(ReplayView, ProjectsTheFlashStepFromLayerShares) {
  ModelConfig c;
  c.n_layers = 4;
  c.compress_ratios = {0, 0, 4, 128};
  ReplayView v;
  v.traced = true;
  v.region_us = {{-1, 2}, {0, 160}, {1, 150}, {2, 200}, {3, 170}, {4, 250}};
  const FlashProjection f = project_flash(v, c);
  ASSERT_TRUE(f.valid);
  EXPECT_NEAR(f.swa_ms, 0.155, 1e-12);
  EXPECT_NEAR(f.csa_ms, 0.2, 1e-12);
  EXPECT_NEAR(f.hca_ms, 0.17, 1e-12);
  EXPECT_NEAR(f.op_sum_ms(), (2 * 155.0 + 21 * 200.0 + 20 * 170.0 + 2 + 250) / 1e3, 1e-12);
}

// The bytes of that step: each kind's mean layer (weights + cache) times its count, embed and head once.
TEST(ReplayView, FlashStepBytesFollowTheSchedule) {
  ModelConfig c;
  c.n_layers = 4;
  c.compress_ratios = {0, 0, 4, 128};
  OpProfile p;
  const auto total = [](double weights, double cache) {
    OpTotal t;
    t.cost.weights = weights;
    t.cost.cache = cache;
    t.cost.activations = 1e9;  // not counted
    return t;
  };
  p.regions = {{-1, total(1e3, 0)}, {0, total(240e6, 1e6)}, {1, total(250e6, 1e6)}, {2, total(270e6, 2e6)},
               {3, total(250e6, 3e6)}, {4, total(1000e6, 0)}};
  EXPECT_NEAR(flash_step_bytes(p, c), 2 * 246e6 + 21 * 272e6 + 20 * 253e6 + 1e3 + 1000e6, 1);
  p.regions.erase(3);  // no HCA layer measured: no projection
  EXPECT_EQ(flash_step_bytes(p, c), 0);
}

// --trace: the replay as Chrome trace events, overlapping items on separate rows, each with its op.
TEST(ReplayView, ChromeTraceHasEveryItemWithItsOp) {
  const Example x;
  const std::string path = ::testing::TempDir() + "replay_view_test_trace.json";
  write_chrome_trace(path, x.replay, x.ops, x.c);
  std::ifstream f(path);
  const nlohmann::json j = nlohmann::json::parse(f);
  const auto& ev = j.at("traceEvents");
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0].at("name"), "k0");
  EXPECT_DOUBLE_EQ(ev[0].at("ts").get<double>(), 0);
  EXPECT_DOUBLE_EQ(ev[1].at("dur").get<double>(), 13);
  EXPECT_EQ(ev[0].at("tid"), 0);
  EXPECT_EQ(ev[1].at("tid"), 1);  // overlaps k0
  EXPECT_EQ(ev[2].at("tid"), 2);  // overlaps both
  EXPECT_EQ(ev[3].at("tid"), 0);  // after all three
  EXPECT_EQ(ev[2].at("args").at("op"), "c");
  EXPECT_EQ(ev[2].at("args").at("kind"), "CSA");
  EXPECT_FALSE(ev[3].at("args").contains("op"));
  std::remove(path.c_str());
}

// A layer's replayed time: the shares of ops reading ≥ 4 MB of weights a call stream, the rest are
// stretches; the overlapped bound is the larger of the stretches and the bytes at the copy bandwidth.
TEST(ReplayView, SplitsLayersIntoStreamingAndStretches) {
  ModelConfig c;
  c.n_layers = 3;
  c.compress_ratios = {0, 4, 128};
  OpProfile p;
  const auto total = [](int calls, double weights) {
    OpTotal t;
    t.calls = calls;
    t.cost.weights = weights;
    return t;
  };
  // "proj" reads 10 MB a call (streams), "mix" 1.5 MB (a stretch), in every layer.
  for (const char* kind : {"SWA", "CSA", "HCA"}) {
    p.ops.push_back({{"proj", kind}, total(1, 10e6)});
    p.ops.push_back({{"mix", kind}, total(1, 1.5e6)});
  }
  for (int r = 0; r < 3; ++r) p.regions[r] = total(2, 11.5e6);
  ReplayView v;
  v.traced = true;
  v.op_region_us = {{{"proj", 0}, 5}, {{"mix", 0}, 20}, {{"proj", 1}, 8}, {{"mix", 1}, 3}, {{"proj", 2}, 6},
                    {{"mix", 2}, 6}, {{"(other)", 2}, 1}};
  const auto split = split_regions(p, v, c);
  EXPECT_DOUBLE_EQ(split.at(0).streaming_us, 5);
  EXPECT_DOUBLE_EQ(split.at(0).stretch_us, 20);
  EXPECT_DOUBLE_EQ(split.at(1).streaming_us, 8);
  EXPECT_DOUBLE_EQ(split.at(1).stretch_us, 3);
  EXPECT_DOUBLE_EQ(split.at(2).stretch_us, 7);  // an op the op table does not know is a stretch
  EXPECT_DOUBLE_EQ(split.at(0).bytes, 11.5e6);
  const double copy_gbs = 1000;  // 11.5 MB → 11.5 µs
  EXPECT_DOUBLE_EQ(split.at(0).overlapped_us(copy_gbs), 20);
  EXPECT_DOUBLE_EQ(split.at(1).overlapped_us(copy_gbs), 11.5);
  const FlashProjection f = project_flash_overlapped(split, copy_gbs, c);
  ASSERT_TRUE(f.valid);
  EXPECT_NEAR(f.swa_ms, 0.020, 1e-12);
  EXPECT_NEAR(f.csa_ms, 0.0115, 1e-12);
  EXPECT_NEAR(f.hca_ms, 0.0115, 1e-12);
}

// Work an op begins for a later op of the same name (moe_begin for moe_experts) adds its time and
// bytes to that op's row and its layer, but is not a call.
TEST(ReplayView, AContinuationIsNotACall) {
  ModelConfig c;
  c.n_layers = 1;
  c.compress_ratios = {0};
  ProfilingBackend::OpRecord begun{"moe", 0, 0.001, {}, true}, main{"moe", 0, 0.004, {}, false};
  begun.cost.activations = 1e3;
  main.cost.weights = 2e6;
  const OpProfile p = summarise_ops({{begun, main}}, c);
  ASSERT_EQ(p.ops.size(), 1u);
  EXPECT_EQ(p.ops[0].second.calls, 1);
  EXPECT_DOUBLE_EQ(p.ops[0].second.ms, 0.005);
  EXPECT_DOUBLE_EQ(p.ops[0].second.cost.weights, 2e6);
  EXPECT_DOUBLE_EQ(p.ops[0].second.cost.activations, 1e3);
  EXPECT_EQ(p.regions.at(0).calls, 1);
}

TEST(ReplayView, NothingTracedIsNotAView) {
  const ReplayView v = replay_view({}, {}, ModelConfig{});
  EXPECT_FALSE(v.traced);
  EXPECT_TRUE(v.op_us.empty());
}

}  // namespace
}  // namespace dsv4::commands
