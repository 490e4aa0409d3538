// Quantisation detection (DESIGN §3.7) and config validation.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/model_config.h"
#include "core/error.h"

namespace dsv4 {
namespace {

using json = nlohmann::json;

json golden_config(const std::string& fixture) {
  std::ifstream in(std::string(DSV4_TEST_DATA) + "/golden/" + fixture + "/config.json");
  return json::parse(in);
}

TEST(ConfigDetection, Fp8WithMxfp4Experts) {
  ModelConfig c = parse_model_config(golden_config("tiny-a").dump(), "", "config.json");
  EXPECT_EQ(c.linear_format, WeightFormat::FP8_BLOCK);
  for (auto f : c.expert_format) EXPECT_EQ(f, WeightFormat::MXFP4);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.compress_ratios, (std::vector<int>{0, 4, 128, 4, 128, 0}));
}

TEST(ConfigDetection, ModelOptNvfp4FromHfQuantConfig) {
  std::ifstream hq(std::string(DSV4_TEST_DATA) + "/golden/tiny-a-nvfp4/hf_quant_config.json");
  std::stringstream ss;
  ss << hq.rdbuf();
  // hf_quant_config.json alone (config.json without the ModelOpt additions) is enough.
  ModelConfig c = parse_model_config(golden_config("tiny-a").dump(), ss.str(), "config.json");
  for (int l = 0; l < c.n_layers; ++l) EXPECT_EQ(c.expert_format[size_t(l)], WeightFormat::NVFP4) << l;
  EXPECT_EQ(c.expert_format.back(), WeightFormat::MXFP4) << "MTP experts stay MXFP4";
  EXPECT_NE(c.quant_summary.find("hf_quant_config.json"), std::string::npos);
}

TEST(ConfigDetection, ModelOptNvfp4FromConfigJson) {
  ModelConfig c = parse_model_config(golden_config("tiny-a-nvfp4").dump(), "", "config.json");
  for (int l = 0; l < c.n_layers; ++l) EXPECT_EQ(c.expert_format[size_t(l)], WeightFormat::NVFP4) << l;
  json j = golden_config("tiny-a");
  j["quantization_config"]["moe_quant_algo"] = "nvfp4";  // no per-layer list: every main layer
  c = parse_model_config(j.dump(), "", "config.json");
  for (int l = 0; l < c.n_layers; ++l) EXPECT_EQ(c.expert_format[size_t(l)], WeightFormat::NVFP4) << l;
  EXPECT_EQ(c.expert_format.back(), WeightFormat::MXFP4);
}

TEST(ConfigDetection, PlainBf16) {
  json j = golden_config("tiny-a");
  j.erase("quantization_config");
  j.erase("expert_dtype");
  ModelConfig c = parse_model_config(j.dump(), "", "config.json");
  EXPECT_EQ(c.linear_format, WeightFormat::BF16);
  for (auto f : c.expert_format) EXPECT_EQ(f, WeightFormat::BF16);
}

TEST(ConfigDetection, RejectsWhatItCannotRun) {
  auto expect_fail = [](json j, const std::string& part) {
    try {
      parse_model_config(j.dump(), "", "config.json");
      ADD_FAILURE() << "accepted; expected an error with " << part;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  json j = golden_config("tiny-a");
  j["model_type"] = "llama";
  expect_fail(j, "deepseek_v4");
  j = golden_config("tiny-a");
  j["compress_ratios"] = {0, 4};
  expect_fail(j, "compress_ratios");
  j = golden_config("tiny-a");
  j["compress_ratios"][1] = 8;
  expect_fail(j, "compress_ratios");
  j = golden_config("tiny-a");
  j["rms_norm_eps"] = "small";
  expect_fail(j, "rms_norm_eps");
  j = golden_config("tiny-a");
  j["quantization_config"]["quant_method"] = "awq";
  expect_fail(j, "quant_method");
  j = golden_config("tiny-a");
  j["num_key_value_heads"] = 8;
  expect_fail(j, "num_key_value_heads");
  j = golden_config("tiny-a");
  j["tie_word_embeddings"] = true;
  expect_fail(j, "tie_word_embeddings");
  j = golden_config("tiny-a");
  j["topk_method"] = "greedy";
  expect_fail(j, "topk_method");
  j = golden_config("tiny-a");
  j["architectures"] = {"LlamaForCausalLM"};
  expect_fail(j, "architectures");
  j = golden_config("tiny-a");
  j["rope_scaling"]["type"] = "linear";
  expect_fail(j, "rope_scaling");
  expect_fail(json::parse("[1,2]"), "not a JSON object");
  try {
    parse_model_config("{\"a\": ", "", "config.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("invalid JSON"), std::string::npos);
  }
}

}  // namespace
}  // namespace dsv4
