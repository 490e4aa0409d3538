// config.json (+ hf_quant_config.json) of a DeepSeek-V4 checkpoint → ModelConfig (SPEC §1.1),
// with the weight formats detected per weight class (DESIGN §3.7).
#pragma once
#include <string>
#include <vector>

#include "core/weight_format.h"

namespace dsv4 {


struct ModelConfig {
  // Sizes (SPEC §1.1 names in comments where they differ).
  int vocab_size = 0;
  int dim = 0;               // hidden_size
  int n_layers = 0;          // num_hidden_layers
  int n_heads = 0;           // num_attention_heads
  int head_dim = 0;
  int rope_dim = 0;          // qk_rope_head_dim
  int q_lora_rank = 0;
  int o_groups = 0;
  int o_lora_rank = 0;
  int window = 0;            // sliding_window
  int index_n_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;
  int n_routed_experts = 0;
  int n_shared_experts = 0;
  int n_active_experts = 0;  // num_experts_per_tok
  int moe_inter_dim = 0;     // moe_intermediate_size
  int n_hash_layers = 0;     // num_hash_layers
  int hc_mult = 0;
  int hc_sinkhorn_iters = 0;
  int n_mtp_layers = 0;      // num_nextn_predict_layers
  int bos_token_id = 0;
  int eos_token_id = 1;
  long max_position_embeddings = 0;
  double route_scale = 1.0;  // routed_scaling_factor
  double swiglu_limit = 0.0;
  double hc_eps = 1e-6;
  double norm_eps = 1e-6;    // rms_norm_eps
  double rope_theta = 10000;
  double compress_rope_theta = 160000;
  // YaRN (rope_scaling), used only by compressed (CSA/HCA) layers.
  double rope_factor = 1;
  long original_seq_len = 0;
  double beta_fast = 32, beta_slow = 1;
  std::vector<int> compress_ratios;  // n_layers + n_mtp_layers entries: 0, 4 or 128

  // Detected formats.
  WeightFormat linear_format = WeightFormat::BF16;      // attention / shared experts / MTP projections
  std::vector<WeightFormat> expert_format;              // per main layer, then per MTP layer
  std::string quant_summary;                            // one line per weight class for the load log

  int nope_dim() const { return head_dim - rope_dim; }
  int total_layers() const { return n_layers + n_mtp_layers; }
};

// Reads DIR/config.json (and DIR/hf_quant_config.json when present). Errors name the file and field.
ModelConfig load_model_config(const std::string& dir);
ModelConfig parse_model_config(const std::string& config_json, const std::string& hf_quant_json,
                               const std::string& source_name);

}  // namespace dsv4
