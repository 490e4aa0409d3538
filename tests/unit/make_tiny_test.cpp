// `dsv4 make-tiny` writes checkpoints the engine loads in both expert formats, and `generate` runs
// on them; the NVFP4 variant is an exact re-encoding of the MXFP4 one (same logits).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "checkpoint/safetensors.h"
#include "test_util.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;
using test::CommandResult;
using test::fresh_dir;
CommandResult dsv4(const std::string& args) { return test::run_dsv4(args); }

TEST(MakeTiny, BothFormatsLoadGenerateAndAgree) {
  const std::string root = fresh_dir("make_tiny");
  const std::string common = " --no-tokenizer --seed 11 --set vocab_size=1024 --set num_hidden_layers=3";
  CommandResult r = dsv4("make-tiny --out " + root + "/mx" + common);
  ASSERT_EQ(r.rc, 0) << r.out;
  r = dsv4("make-tiny --experts-format nvfp4 --out " + root + "/nv" + common);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(fs::exists(root + "/nv/hf_quant_config.json"));

  r = dsv4("inspect --model " + root + "/nv");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("nvfp4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("in 3 of 3 main layers"), std::string::npos) << r.out;

  r = dsv4("generate --model " + root + "/mx --prompt-ids 5,6,7,8 -n 4 --ids");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("decode: 4 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tok/s"), std::string::npos) << r.out;

  std::vector<int32_t> prompt;
  for (int i = 0; i < 140; ++i) prompt.push_back(2 + (i * 37) % 1000);
  write_safetensors(root + "/in.safetensors", {make_tensor_out("prompt_ids", DType::I32, {int64_t(prompt.size())}, prompt.data())});
  for (auto f : {"mx", "nv"}) {
    r = dsv4(std::string("logits --model ") + root + "/" + f + " --input " + root + "/in.safetensors --output-dir " + root + "/out_" + f);
    ASSERT_EQ(r.rc, 0) << r.out;
  }
  SafetensorsFile a(root + "/out_mx/in.safetensors"), b(root + "/out_nv/in.safetensors");
  const TensorRef &la = a.tensors().at("prefill_logits"), &lb = b.tensors().at("prefill_logits");
  ASSERT_EQ(la.shape, lb.shape);
  ASSERT_EQ(la.dtype, lb.dtype);
  double max_diff = 0;
  int64_t differ = 0;
  for (int64_t i = 0; i < la.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(la.as<float>()[i]));
    max_diff = std::max(max_diff, double(std::fabs(la.as<float>()[i] - lb.as<float>()[i])));
    differ += std::memcmp(&la.as<float>()[i], &lb.as<float>()[i], sizeof(float)) != 0;
  }
  std::printf("mxfp4 vs nvfp4 re-encoding: %lld of %lld logits differ, max |d logit| = %g\n", (long long)differ,
              (long long)la.numel(), max_diff);
  EXPECT_EQ(differ, 0) << "the NVFP4 re-encoding must give the same logits bit for bit";
}

TEST(MakeTiny, PlainBf16CheckpointLoadsAndRuns) {
  const std::string dir = fresh_dir("make_tiny_bf16") + "/model";
  CommandResult r = dsv4("make-tiny --bf16 --no-tokenizer --seed 3 --set vocab_size=1024 --set num_hidden_layers=3 --out " + dir);
  ASSERT_EQ(r.rc, 0) << r.out;
  r = dsv4("inspect --model " + dir);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("linears (attention, shared experts, MTP projections): bf16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("routed experts: bf16"), std::string::npos) << r.out;
  r = dsv4("generate --model " + dir + " --prompt-ids 5,6,7,8,9 -n 8 --ids");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("decode: 8 tokens"), std::string::npos) << r.out;
}

TEST(Generate, StopsAtEndOfSequence) {
  // Same weights, with eos_token_id set to the token greedy decoding produces second.
  const std::string root = fresh_dir("generate_eos");
  const std::string common = " --no-tokenizer --seed 21 --set vocab_size=1024 --set num_hidden_layers=2";
  CommandResult r = dsv4("make-tiny --out " + root + "/a" + common);
  ASSERT_EQ(r.rc, 0) << r.out;
  test::SplitResult split = test::run_dsv4_split("generate --model " + root + "/a --prompt-ids 9,8,7 -n 4 --ignore-eos --ids");
  ASSERT_EQ(split.rc, 0) << split.err;
  std::vector<int> ids;
  std::stringstream ss(split.out);
  for (std::string part; std::getline(ss, part, ',');) ids.push_back(std::stoi(part));
  ASSERT_EQ(ids.size(), 4u);
  size_t first_eos = std::find(ids.begin(), ids.end(), ids[1]) - ids.begin();  // ids[1] may repeat ids[0]
  r = dsv4("make-tiny --out " + root + "/b" + common + " --set eos_token_id=" + std::to_string(ids[1]));
  ASSERT_EQ(r.rc, 0) << r.out;
  split = test::run_dsv4_split("generate --model " + root + "/b --prompt-ids 9,8,7 -n 4 --ids");
  ASSERT_EQ(split.rc, 0) << split.err;
  std::string want;
  for (size_t i = 0; i <= first_eos; ++i) {
    if (i) want += ",";
    want += std::to_string(ids[i]);
  }
  EXPECT_EQ(split.out, want + "\n");
  EXPECT_NE(split.err.find("stopped at the end-of-sequence token"), std::string::npos) << split.err;
}

TEST(Generate, RejectsBadInput) {
  CommandResult r = dsv4("generate --model /nonexistent --prompt-ids 1,2");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("error:"), std::string::npos) << r.out;
  r = dsv4("generate --model " + std::string(DSV4_TEST_DATA) + "/golden/tiny-a --prompt-ids 1,x,3");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("not a token id"), std::string::npos) << r.out;
  r = dsv4("generate --model " + std::string(DSV4_TEST_DATA) + "/golden/tiny-a --prompt-ids 1,99999");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("outside the vocabulary"), std::string::npos) << r.out;
  r = dsv4("generate --model " + std::string(DSV4_TEST_DATA) + "/golden/tiny-a --prompt-ids 1,2 --backend cuda");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("cuda"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace dsv4
