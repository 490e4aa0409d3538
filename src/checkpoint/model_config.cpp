#include "checkpoint/model_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace dsv4 {

using json = nlohmann::json;

namespace {

const char* json_type(const json& j) { return j.type_name(); }

struct Reader {
  const json& j;
  std::string src;
  [[noreturn]] void wrong(const std::string& key, const char* want) const {
    fail("{}: field {} must be {}, found {} ({})", src, key, want, json_type(j.at(key)), j.at(key).dump());
  }
  bool has(const std::string& key) const { return j.contains(key) && !j.at(key).is_null(); }
  void need(const std::string& key) const {
    if (!has(key)) fail("{}: required field {} is missing", src, key);
  }
  long integer(const std::string& key) const {
    need(key);
    if (!j.at(key).is_number_integer()) wrong(key, "an integer");
    return j.at(key).get<long>();
  }
  int int_pos(const std::string& key) const {
    long v = integer(key);
    if (v <= 0 || v > (1L << 31) - 1) fail("{}: field {} must be a positive integer, found {}", src, key, v);
    return int(v);
  }
  double number(const std::string& key) const {
    need(key);
    if (!j.at(key).is_number()) wrong(key, "a number");
    return j.at(key).get<double>();
  }
  std::string string(const std::string& key) const {
    need(key);
    if (!j.at(key).is_string()) wrong(key, "a string");
    return j.at(key).get<std::string>();
  }
  bool boolean(const std::string& key) const {
    need(key);
    if (!j.at(key).is_boolean()) wrong(key, "a boolean");
    return j.at(key).get<bool>();
  }
};

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  if (!in) fail("{}: cannot read", p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// NVIDIA ModelOpt NVFP4 experts: the set of main layers whose routed experts are NVFP4, from
// hf_quant_config.json ("quantization") or config.json's quantization_config.
bool nvfp4_layers(const json& q, int n_layers, std::vector<bool>* layers) {
  auto algo = [](const json& o, const char* k) {
    return o.contains(k) && o[k].is_string() ? o[k].get<std::string>() : std::string();
  };
  std::string qa = algo(q, "quant_algo"), moe = algo(q, "moe_quant_algo");
  for (auto& c : moe) c = char(toupper(c));
  bool mixed = qa == "MIXED_PRECISION";
  if (!mixed && moe != "NVFP4") return false;
  layers->assign(size_t(n_layers), false);
  bool any = false;
  if (q.contains("quantized_layers") && q["quantized_layers"].is_object()) {
    for (auto& [name, spec] : q["quantized_layers"].items()) {
      if (!spec.is_object() || algo(spec, "quant_algo") != "NVFP4") continue;
      int layer = -1;
      if (std::sscanf(name.c_str(), "layers.%d.ffn.experts", &layer) == 1 && layer >= 0 && layer < n_layers) {
        (*layers)[size_t(layer)] = true;
        any = true;
      }
    }
  }
  if (!any && moe == "NVFP4") {  // moe_quant_algo without a per-layer list: every main layer
    layers->assign(size_t(n_layers), true);
    any = true;
  }
  return any;
}

}  // namespace

ModelConfig parse_model_config(const std::string& config_text, const std::string& hf_quant_text,
                               const std::string& src) {
  json j;
  try {
    j = json::parse(config_text);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", src, e.what());
  }
  if (!j.is_object()) fail("{}: not a JSON object", src);
  Reader r{j, src};
  if (r.string("model_type") != "deepseek_v4")
    fail("{}: model_type is {}, this engine runs deepseek_v4 only", src, j["model_type"].dump());
  ModelConfig c;
  c.vocab_size = r.int_pos("vocab_size");
  c.dim = r.int_pos("hidden_size");
  c.n_layers = r.int_pos("num_hidden_layers");
  c.n_heads = r.int_pos("num_attention_heads");
  c.head_dim = r.int_pos("head_dim");
  c.rope_dim = r.int_pos("qk_rope_head_dim");
  c.q_lora_rank = r.int_pos("q_lora_rank");
  c.o_groups = r.int_pos("o_groups");
  c.o_lora_rank = r.int_pos("o_lora_rank");
  c.window = r.int_pos("sliding_window");
  c.index_n_heads = r.int_pos("index_n_heads");
  c.index_head_dim = r.int_pos("index_head_dim");
  c.index_topk = r.int_pos("index_topk");
  c.n_routed_experts = r.int_pos("n_routed_experts");
  c.n_shared_experts = r.int_pos("n_shared_experts");
  c.n_active_experts = r.int_pos("num_experts_per_tok");
  c.moe_inter_dim = r.int_pos("moe_intermediate_size");
  c.n_hash_layers = int(r.integer("num_hash_layers"));
  c.hc_mult = r.int_pos("hc_mult");
  c.hc_sinkhorn_iters = r.int_pos("hc_sinkhorn_iters");
  c.n_mtp_layers = r.has("num_nextn_predict_layers") ? int(r.integer("num_nextn_predict_layers")) : 0;
  c.bos_token_id = int(r.integer("bos_token_id"));
  c.eos_token_id = int(r.integer("eos_token_id"));
  c.max_position_embeddings = r.integer("max_position_embeddings");
  c.route_scale = r.number("routed_scaling_factor");
  c.swiglu_limit = r.number("swiglu_limit");
  c.hc_eps = r.number("hc_eps");
  c.norm_eps = r.number("rms_norm_eps");
  c.rope_theta = r.number("rope_theta");
  c.compress_rope_theta = r.number("compress_rope_theta");
  if (r.integer("num_key_value_heads") != 1) fail("{}: num_key_value_heads must be 1 (one shared K=V head)", src);
  if (c.n_shared_experts != 1) fail("{}: n_shared_experts must be 1, found {}", src, c.n_shared_experts);
  if (r.string("scoring_func") != "sqrtsoftplus") fail("{}: scoring_func {} is not supported (sqrtsoftplus)", src, j["scoring_func"].dump());
  if (r.string("hidden_act") != "silu") fail("{}: hidden_act {} is not supported (silu)", src, j["hidden_act"].dump());
  if (!r.boolean("norm_topk_prob")) fail("{}: norm_topk_prob false is not supported", src);
  // Fields with one meaning for this family: checked when present.
  if (r.has("topk_method") && r.string("topk_method") != "noaux_tc")
    fail("{}: topk_method {} is not supported (noaux_tc)", src, j["topk_method"].dump());
  if (r.has("tie_word_embeddings") && r.boolean("tie_word_embeddings"))
    fail("{}: tie_word_embeddings true is not supported (DeepSeek-V4 has separate embed and head)", src);
  if (r.has("attention_bias") && r.boolean("attention_bias")) fail("{}: attention_bias true is not supported", src);
  if (r.has("architectures")) {
    const json& a = j["architectures"];
    if (!a.is_array() || std::find(a.begin(), a.end(), json("DeepseekV4ForCausalLM")) == a.end())
      fail("{}: architectures {} does not name DeepseekV4ForCausalLM", src, a.dump());
  }
  if (c.rope_dim % 2 || c.rope_dim >= c.head_dim) fail("{}: qk_rope_head_dim {} must be even and below head_dim", src, c.rope_dim);
  if ((c.head_dim - c.rope_dim) % 64) fail("{}: head_dim - qk_rope_head_dim must be a multiple of 64 (FP8 KV blocks)", src);
  if (c.n_heads % c.o_groups) fail("{}: num_attention_heads must be a multiple of o_groups", src);
  if (c.dim % 128 || c.moe_inter_dim % 128 || c.q_lora_rank % 128)
    fail("{}: hidden_size, moe_intermediate_size and q_lora_rank must be multiples of 128", src);
  if (c.index_head_dim != 128) fail("{}: index_head_dim must be 128 (Hadamard rotation size)", src);
  if (c.n_active_experts > c.n_routed_experts) fail("{}: num_experts_per_tok exceeds n_routed_experts", src);

  if (!r.has("rope_scaling") || !j["rope_scaling"].is_object()) fail("{}: required object rope_scaling is missing", src);
  Reader rs{j["rope_scaling"], src + " rope_scaling"};
  c.rope_factor = rs.number("factor");
  c.original_seq_len = rs.integer("original_max_position_embeddings");
  c.beta_fast = rs.number("beta_fast");
  c.beta_slow = rs.number("beta_slow");
  if (rs.has("type") && rs.string("type") != "yarn") fail("{}: rope_scaling type {} is not supported (yarn)", src, j["rope_scaling"]["type"].dump());

  r.need("compress_ratios");
  if (!j["compress_ratios"].is_array()) r.wrong("compress_ratios", "an array");
  for (auto& v : j["compress_ratios"]) {
    if (!v.is_number_integer() || (v.get<int>() != 0 && v.get<int>() != 4 && v.get<int>() != 128))
      fail("{}: compress_ratios entries must be 0, 4 or 128, found {}", src, v.dump());
    c.compress_ratios.push_back(v.get<int>());
  }
  if (int(c.compress_ratios.size()) < c.total_layers())
    fail("{}: compress_ratios has {} entries, {} layers + {} MTP need {}", src, c.compress_ratios.size(), c.n_layers,
         c.n_mtp_layers, c.total_layers());
  c.compress_ratios.resize(size_t(c.total_layers()));

  // Weight formats (DESIGN §3.7).
  bool fp8 = false;
  if (r.has("quantization_config")) {
    const json& q = j["quantization_config"];
    if (!q.is_object()) r.wrong("quantization_config", "an object");
    Reader qr{q, src + " quantization_config"};
    if (qr.string("quant_method") != "fp8") fail("{}: quant_method {} is not supported (fp8)", src, q["quant_method"].dump());
    if (qr.has("fmt") && qr.string("fmt") != "e4m3") fail("{}: quantization fmt must be e4m3", src);
    if (qr.has("weight_block_size") && q["weight_block_size"] != json::array({128, 128}))
      fail("{}: weight_block_size must be [128, 128]", src);
    fp8 = true;
  }
  c.linear_format = fp8 ? WeightFormat::FP8_BLOCK : WeightFormat::BF16;
  WeightFormat expert = c.linear_format;
  if (r.has("expert_dtype")) {
    std::string ed = r.string("expert_dtype");
    if (ed != "fp4") fail("{}: expert_dtype {} is not supported (fp4)", src, ed);
    expert = WeightFormat::MXFP4;
  }
  c.expert_format.assign(size_t(c.total_layers()), expert);
  std::vector<bool> nv;
  std::string nv_source;
  if (!hf_quant_text.empty()) {
    json h;
    try {
      h = json::parse(hf_quant_text);
    } catch (const json::exception& e) {
      fail("hf_quant_config.json: invalid JSON: {}", e.what());
    }
    if (h.contains("quantization") && h["quantization"].is_object() && nvfp4_layers(h["quantization"], c.n_layers, &nv))
      nv_source = "hf_quant_config.json";
  }
  if (nv_source.empty() && j.contains("quantization_config") && nvfp4_layers(j["quantization_config"], c.n_layers, &nv))
    nv_source = "config.json quantization_config";
  int n_nv = 0;
  for (int l = 0; l < int(nv.size()); ++l)
    if (nv[size_t(l)]) c.expert_format[size_t(l)] = WeightFormat::NVFP4, ++n_nv;

  c.quant_summary = fmt::format("linears (attention, shared experts, MTP projections): {}\n", weight_format_name(c.linear_format));
  if (n_nv)
    c.quant_summary += fmt::format("routed experts: {} in {} of {} main layers (ModelOpt, from {}); other layers and MTP: {}\n",
                                   weight_format_name(WeightFormat::NVFP4), n_nv, c.n_layers, nv_source,
                                   weight_format_name(expert));
  else
    c.quant_summary += fmt::format("routed experts: {}\n", weight_format_name(expert));
  c.quant_summary += "embedding, head, compressors, gates, indexer weights_proj: bf16; hyper-connections, sinks, ape: f32";
  return c;
}

ModelConfig load_model_config(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) fail("{}: not a directory", dir);
  fs::path cfg = fs::path(dir) / "config.json";
  if (!fs::exists(cfg)) fail("{}: config.json is missing", dir);
  fs::path hq = fs::path(dir) / "hf_quant_config.json";
  return parse_model_config(read_file(cfg), fs::exists(hq) ? read_file(hq) : "", cfg.string());
}

}  // namespace dsv4
