// `dsv4 make-tiny`: a random-weight DeepSeek-V4 checkpoint in the official on-disk format
// (SPEC §5.1; NVIDIA ModelOpt NVFP4 experts per §5.3 on request), loadable by the engine.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace dsv4 {

struct TinyModelOptions {
  std::string out_dir;
  std::string experts_format = "mxfp4";  // mxfp4 | nvfp4
  bool bf16 = false;                     // a plain BF16 checkpoint: no FP8 or FP4 anywhere
  uint64_t seed = 1;
  // config.json fields to override (name → JSON value text), e.g. {"num_hidden_layers", "3"}.
  std::map<std::string, std::string> overrides;
};

// Writes config.json, two shards + model.safetensors.index.json (and hf_quant_config.json for
// nvfp4). Returns the number of tensors written.
int make_tiny_model(const TinyModelOptions& opts);

// The embedded default's config.json: tiny-a's shape (the golden fixtures') with DeepSeek-V4's
// every other field and the full vocabulary. The synthetic models start from it too.
nlohmann::json default_tiny_config();

}  // namespace dsv4
