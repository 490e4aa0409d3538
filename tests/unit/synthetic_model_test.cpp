// Synthetic models (model/synthetic.h) through the real loader and commands: the tiny shape on the
// CPU backend — same spec, same weights (so the same greedy tokens); options checked; the profile
// command runs on it.
#include <gtest/gtest.h>

#include <string>

#include "model/synthetic.h"
#include "test_util.h"

namespace dsv4::test {
namespace {

// The "ids" array of a `generate --json` result, as text ("" when absent).
std::string tokens(const std::string& out) {
  const size_t p = out.find("\"ids\"");
  return p == std::string::npos ? std::string() : out.substr(p, out.find(']', p) - p);
}

TEST(SyntheticModel, SameSpecSameWeightsAndBothExpertFormats) {
  const std::string gen = " --prompt-ids 5,6,7,8 -n 6 --json";
  CommandResult a = run_dsv4("generate --model synthetic:tiny,seed=7" + gen);
  ASSERT_EQ(a.rc, 0) << a.out;
  CommandResult b = run_dsv4("generate --model synthetic:tiny,seed=7" + gen);
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_FALSE(tokens(a.out).empty()) << a.out;
  EXPECT_EQ(tokens(a.out), tokens(b.out));
  CommandResult other = run_dsv4("generate --model synthetic:tiny,seed=8" + gen);
  ASSERT_EQ(other.rc, 0) << other.out;
  EXPECT_NE(tokens(a.out), tokens(other.out));  // another seed, other weights
  CommandResult nv = run_dsv4("generate --model synthetic:tiny,experts=nvfp4,layers=3" + gen);
  ASSERT_EQ(nv.rc, 0) << nv.out;
  EXPECT_NE(nv.out.find("nvfp4"), std::string::npos) << nv.out;
}

TEST(SyntheticModel, FlashShapeAndScheduleWithoutGeneratingIt) {
  SyntheticSource s("synthetic:flash,layers=5");
  const ModelConfig& c = s.config();
  EXPECT_EQ(c.dim, 4096);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.compress_ratios, (std::vector<int>{0, 0, 4, 128, 4, 0}));  // SPEC §1.2's first five, then MTP
  EXPECT_EQ(SyntheticSource("synthetic:flash").config().n_layers, 43);
}

TEST(SyntheticModel, BadSpecsAreClearErrors) {
  for (const char* spec : {"synthetic:huge", "synthetic:tiny,layers=0", "synthetic:tiny,layers=x", "synthetic:tiny,experts=int8",
                           "synthetic:tiny,colour=blue", "synthetic:tiny,seed=abc", "synthetic:tiny,novalue"}) {
    CommandResult r = run_dsv4(std::string("generate --model ") + spec + " --prompt-ids 5 -n 1");
    EXPECT_NE(r.rc, 0) << spec;
    EXPECT_NE(r.out.find("synthetic:"), std::string::npos) << spec << ": " << r.out;
  }
}

TEST(SyntheticModel, ProfileReportsTheStepByOpAndLayer) {
  CommandResult r = run_dsv4("profile --model synthetic:tiny --backend cpu --batch-size 2 --context 70 --steps 2");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (const char* row : {"eager step", "host: plan", "sum of the op times", "bytes per step", "copy bandwidth", "tokens/s",
                          "### ops", "| linears attn.wq_a + attn.wkv | SWA |", "| linear attn.wq_b | SWA |",
                          "| sparse_attention | CSA |", "| indexer_topk | CSA |", "| compressor_update | HCA |", "| moe_experts (shared + routed) | HCA |", "| logits (head) | head |",
                          "### layers", "| 0 | SWA |", "| 4 | HCA |", "### projected", "bytes a step:", "% of copy) →",
                          "2 SWA ×", "21 CSA ×", "20 HCA ×"})
    EXPECT_NE(r.out.find(row), std::string::npos) << row << "\n" << r.out;
  CommandResult j = run_dsv4("profile --model synthetic:tiny --backend cpu --steps 1 --context 10 --json");
  ASSERT_EQ(j.rc, 0) << j.out;
  for (const char* key : {"\"eager_step_ms\"", "\"op_sum_ms\"", "\"ops\"", "\"regions\"", "\"flash_projection\"", "\"copy_fraction\""})
    EXPECT_NE(j.out.find(key), std::string::npos) << key << "\n" << j.out;
  CommandResult p = run_dsv4("profile --model synthetic:tiny --backend cpu --prefill 200 --steps 1");
  ASSERT_EQ(p.rc, 0) << p.out;
  for (const char* row : {"one prompt of 200 tokens", "FLOP of the step", "model TFLOP/s", "| TFLOP/s |", "| sparse_attention | CSA |"})
    EXPECT_NE(p.out.find(row), std::string::npos) << row << "\n" << p.out;
  EXPECT_NE(run_dsv4("profile --model synthetic:tiny --backend cpu --prefill -3").rc, 0);
}

// Split over two ranks: rank 0's ops, the all-reduces among them, under the same op names.
TEST(SyntheticModel, ProfileOfASplitModelShowsItsAllReduces) {
  for (const std::string split : {" --tensor-parallel-size 2", " --tensor-parallel-size 2 --expert-parallel"}) {
    CommandResult r = run_dsv4("profile --model synthetic:tiny --backend cpu --batch-size 2 --context 40 --steps 2" + split);
    ASSERT_EQ(r.rc, 0) << split << "\n" << r.out;
    for (const char* row : {"(2 × cpu)", "| linear attn.wo_b | SWA |", "| all_reduce attn.wo_b | SWA |",
                            "| all_reduce moe | CSA |", "| moe_experts (shared + routed) | HCA |", "| moe_combine | HCA |",
                            "### projected"})
      EXPECT_NE(r.out.find(row), std::string::npos) << split << ": " << row << "\n" << r.out;
  }
  CommandResult j = run_dsv4("profile --model synthetic:tiny --backend cpu --steps 1 --context 10 --json --tensor-parallel-size 2");
  ASSERT_EQ(j.rc, 0) << j.out;
  EXPECT_NE(j.out.find("\"tensor_parallel_size\": 2"), std::string::npos) << j.out;
  CommandResult p = run_dsv4("profile --model synthetic:tiny --backend cpu --prefill 64 --steps 1 --tensor-parallel-size 2");
  ASSERT_EQ(p.rc, 0) << p.out;
  EXPECT_NE(p.out.find("| all_reduce moe |"), std::string::npos) << p.out;
  EXPECT_EQ(run_dsv4("profile --model synthetic:tiny --backend cpu --tensor-parallel-size 3").rc, 2);
}

// make-tiny --like writes the generated model as an official-format checkpoint: loading it from
// disk gives the same model (the same greedy tokens) as generating it.
TEST(SyntheticModel, WrittenToDiskLoadsAsTheSameModel) {
  const std::string dir = fresh_dir("synthetic_on_disk");
  CommandResult w = run_dsv4("make-tiny --like synthetic:tiny,layers=3,seed=5 --out " + dir + " --force");
  ASSERT_EQ(w.rc, 0) << w.out;
  const std::string gen = " --prompt-ids 5,6,7,8 -n 6 --json";
  CommandResult disk = run_dsv4("generate --model " + dir + gen);
  ASSERT_EQ(disk.rc, 0) << disk.out;
  CommandResult made = run_dsv4("generate --model synthetic:tiny,layers=3,seed=5" + gen);
  ASSERT_EQ(made.rc, 0) << made.out;
  EXPECT_FALSE(tokens(disk.out).empty()) << disk.out;
  EXPECT_EQ(tokens(disk.out), tokens(made.out));
  CommandResult inspect = run_dsv4("inspect --model " + dir);
  EXPECT_EQ(inspect.rc, 0) << inspect.out;
  // Its options go in the spec; a second write needs --force.
  EXPECT_EQ(run_dsv4("make-tiny --like synthetic:tiny --seed 3 --out " + dir + " --force").rc, 2);
  EXPECT_NE(run_dsv4("make-tiny --like synthetic:tiny --out " + dir).rc, 0);
  EXPECT_EQ(run_dsv4("make-tiny --like tiny --out " + dir + " --force").rc, 2);
}

}  // namespace
}  // namespace dsv4::test
