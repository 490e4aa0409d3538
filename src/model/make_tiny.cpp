#include "model/make_tiny.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <numeric>
#include <random>

#include "checkpoint/model_config.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"

namespace dsv4 {

using json = nlohmann::json;

// The embedded default: tiny-a's shape (SPEC §1.1 fields, sizes shrunk) with the full vocabulary,
// so the project's tokenizer can drive it.
nlohmann::json default_tiny_config() {
  return json{
      {"architectures", {"DeepseekV4ForCausalLM"}}, {"model_type", "deepseek_v4"}, {"attention_bias", false},
      {"attention_dropout", 0.0}, {"bos_token_id", 0}, {"eos_token_id", 1}, {"expert_dtype", "fp4"},
      {"hc_eps", 1e-6}, {"hc_mult", 4}, {"hc_sinkhorn_iters", 20}, {"head_dim", 512}, {"hidden_act", "silu"},
      {"hidden_size", 128}, {"index_head_dim", 128}, {"index_n_heads", 4}, {"index_topk", 16},
      {"initializer_range", 0.02}, {"max_position_embeddings", 1048576}, {"moe_intermediate_size", 256},
      {"n_routed_experts", 8}, {"n_shared_experts", 1}, {"norm_topk_prob", true}, {"num_attention_heads", 4},
      {"num_experts_per_tok", 6}, {"num_hidden_layers", 5}, {"num_hash_layers", 2}, {"num_key_value_heads", 1},
      {"num_nextn_predict_layers", 1}, {"o_groups", 2}, {"o_lora_rank", 128}, {"q_lora_rank", 128},
      {"qk_rope_head_dim", 64},
      {"quantization_config",
       {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"}, {"scale_fmt", "ue8m0"},
        {"weight_block_size", {128, 128}}}},
      {"rms_norm_eps", 1e-6},
      {"rope_scaling", {{"beta_fast", 32}, {"beta_slow", 1}, {"factor", 16}, {"original_max_position_embeddings", 65536}, {"type", "yarn"}}},
      {"rope_theta", 10000}, {"routed_scaling_factor", 1.5}, {"scoring_func", "sqrtsoftplus"}, {"sliding_window", 128},
      {"swiglu_limit", 10.0}, {"tie_word_embeddings", false}, {"topk_method", "noaux_tc"}, {"torch_dtype", "bfloat16"},
      {"transformers_version", "4.57.1"}, {"use_cache", true}, {"vocab_size", 129280}, {"compress_rope_theta", 160000},
      {"compress_ratios", {0, 4, 128, 4, 128, 0}}};
}

namespace {

class TensorMaker {
 public:
  TensorMaker(uint64_t seed, bool bf16_only) : rng_(seed), bf16_only_(bf16_only) {}

  std::vector<float> normal(int64_t n, float std) {
    std::normal_distribution<float> d(0.0f, std);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = d(rng_);
    return v;
  }
  TensorOut bf16(const std::string& name, std::vector<int64_t> shape, float std, float mean = 0) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    auto v = normal(n, std);
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i] + mean);
    return make_tensor_out(name, DType::BF16, std::move(shape), h.data());
  }
  TensorOut f32(const std::string& name, std::vector<int64_t> shape, float std, float mean = 0) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    auto v = normal(n, std);
    for (auto& x : v) x += mean;
    return make_tensor_out(name, DType::F32, std::move(shape), v.data());
  }
  // FP8 e4m3 weight + 128×128 ue8m0 block scales, quantised from N(0, 1/in).
  void fp8(std::vector<TensorOut>& out, const std::string& p, int rows, int cols) {
    if (bf16_only_) return out.push_back(bf16(p + ".weight", {rows, cols}, 1.0f / std::sqrt(float(cols))));
    auto v = normal(int64_t(rows) * cols, 1.0f / std::sqrt(float(cols)));
    const int br = (rows + 127) / 128, bc = (cols + 127) / 128;
    std::vector<uint8_t> w(v.size()), s(size_t(br) * size_t(bc));
    for (int i = 0; i < br; ++i)
      for (int j = 0; j < bc; ++j) {
        float amax = 1e-4f;
        for (int r = i * 128; r < std::min(rows, i * 128 + 128); ++r)
          for (int c = j * 128; c < std::min(cols, j * 128 + 128); ++c) amax = std::max(amax, std::fabs(v[size_t(r) * size_t(cols) + size_t(c)]));
        float sc = pow2_ceil(amax / 448.0f);
        s[size_t(i) * size_t(bc) + size_t(j)] = f32_pow2_to_e8m0(sc);
        for (int r = i * 128; r < std::min(rows, i * 128 + 128); ++r)
          for (int c = j * 128; c < std::min(cols, j * 128 + 128); ++c)
            w[size_t(r) * size_t(cols) + size_t(c)] = f32_to_e4m3(v[size_t(r) * size_t(cols) + size_t(c)] / sc);
      }
    out.push_back(make_tensor_out(p + ".weight", DType::F8_E4M3, {rows, cols}, w.data()));
    out.push_back(make_tensor_out(p + ".scale", DType::F8_E8M0, {br, bc}, s.data()));
  }
  // MXFP4 (I8 packed e2m1 + ue8m0 per 32) or, with nvfp4 = true, the same values as NVFP4
  // (U8 + e4m3 per 16 + f32 global scale; exact re-encoding as ModelOpt's cast does).
  void fp4(std::vector<TensorOut>& out, const std::string& p, int rows, int cols, bool nvfp4, float global) {
    if (bf16_only_) return out.push_back(bf16(p + ".weight", {rows, cols}, 1.0f / std::sqrt(float(cols))));
    auto v = normal(int64_t(rows) * cols, 1.0f / std::sqrt(float(cols)));
    std::vector<uint8_t> w(size_t(rows) * size_t(cols / 2)), s(size_t(rows) * size_t(cols / 32));
    for (int r = 0; r < rows; ++r)
      for (int b = 0; b < cols / 32; ++b) {
        float amax = 1e-6f;
        for (int c = b * 32; c < b * 32 + 32; ++c) amax = std::max(amax, std::fabs(v[size_t(r) * size_t(cols) + size_t(c)]));
        float sc = pow2_ceil(amax / 6.0f);
        s[size_t(r) * size_t(cols / 32) + size_t(b)] = f32_pow2_to_e8m0(sc);
        for (int c = b * 32; c < b * 32 + 32; c += 2) {
          uint8_t lo = f32_to_e2m1(v[size_t(r) * size_t(cols) + size_t(c)] / sc);
          uint8_t hi = f32_to_e2m1(v[size_t(r) * size_t(cols) + size_t(c) + 1] / sc);
          w[size_t(r) * size_t(cols / 2) + size_t(c / 2)] = uint8_t(lo | (hi << 4));
        }
      }
    if (!nvfp4) {
      out.push_back(make_tensor_out(p + ".weight", DType::I8, {rows, cols / 2}, w.data()));
      out.push_back(make_tensor_out(p + ".scale", DType::F8_E8M0, {rows, cols / 32}, s.data()));
      return;
    }
    // Per-16 e4m3 scale = 2^(k − g) relative to the global power of two 2^g (exact while in range).
    std::vector<uint8_t> s16(size_t(rows) * size_t(cols / 16));
    for (size_t i = 0; i < s.size(); ++i) {
      uint8_t code = f32_to_e4m3(e8m0_to_f32(s[i]) / global);
      s16[2 * i] = s16[2 * i + 1] = code;
    }
    out.push_back(make_tensor_out(p + ".weight", DType::U8, {rows, cols / 2}, w.data()));
    out.push_back(make_tensor_out(p + ".weight_scale", DType::F8_E4M3, {rows, cols / 16}, s16.data()));
    out.push_back(make_tensor_out(p + ".weight_scale_2", DType::F32, {}, &global));
    float input_scale = 4.0f / (6.0f * 448.0f);
    out.push_back(make_tensor_out(p + ".input_scale", DType::F32, {}, &input_scale));
  }

 private:
  std::mt19937_64 rng_;
  bool bf16_only_;
};

void write_json(const std::filesystem::path& p, const json& j) {
  std::ofstream out(p);
  if (!out) fail("{}: cannot write", p.string());
  out << j.dump(2) << "\n";
}

}  // namespace

int make_tiny_model(const TinyModelOptions& opts) {
  namespace fs = std::filesystem;
  if (opts.experts_format != "mxfp4" && opts.experts_format != "nvfp4")
    fail("--experts-format must be mxfp4 or nvfp4, not {}", opts.experts_format);
  json cfg = default_tiny_config();
  for (auto& [k, v] : opts.overrides) {
    if (!cfg.contains(k)) fail("unknown config field {} (see SPEC.md §1.1 for the field names)", k);
    try {
      cfg[k] = json::parse(v);
    } catch (const json::exception&) {
      cfg[k] = v;  // a bare word is a string
    }
  }
  if (opts.bf16 && opts.experts_format == "nvfp4") fail("--bf16 and --experts-format nvfp4 exclude each other");
  const bool nv = opts.experts_format == "nvfp4";
  if (opts.bf16) {
    cfg.erase("quantization_config");
    cfg.erase("expert_dtype");
  }
  std::vector<int> layers_nv;
  if (nv) {
    cfg["quantization_config"]["quant_algo"] = "MIXED_PRECISION";
    cfg["quantization_config"]["moe_quant_algo"] = "NVFP4";
    cfg["quantization_config"]["group_size"] = 16;
    cfg["quantization_config"]["producer"] = {{"name", "modelopt"}, {"version", "dsv4-nvfp4-experts"}};
  }
  const std::string cfg_text = cfg.dump();
  ModelConfig c = parse_model_config(cfg_text, "", "config.json");  // validates the overrides
  fs::create_directories(opts.out_dir);

  TensorMaker mk(opts.seed, opts.bf16);
  std::vector<TensorOut> base, experts;
  const int D = c.dim, H = c.n_heads, hd = c.head_dim, hc = c.hc_mult, mix = (2 + hc) * hc, E = c.n_routed_experts,
            I = c.moe_inter_dim, V = c.vocab_size;
  base.push_back(mk.bf16("embed.weight", {V, D}, 1.0f));
  base.push_back(mk.bf16("head.weight", {V, D}, 1.0f / std::sqrt(float(D))));
  base.push_back(mk.bf16("norm.weight", {D}, 0.1f, 1.0f));
  auto hc_head = [&](const std::string& p) {
    base.push_back(mk.f32(p + "hc_head_fn", {hc, hc * D}, 0.01f));
    base.push_back(mk.f32(p + "hc_head_base", {hc}, 0.5f));
    base.push_back(mk.f32(p + "hc_head_scale", {1}, 0.1f, 1.0f));
  };
  hc_head("");
  auto block = [&](const std::string& p, int layer, bool mtp) {
    const int ratio = c.compress_ratios[size_t(layer)];
    for (auto* n : {".attn_norm.weight", ".ffn_norm.weight"}) base.push_back(mk.bf16(p + n, {D}, 0.1f, 1.0f));
    for (auto* s : {"attn", "ffn"}) {
      base.push_back(mk.f32(fmt::format("{}.hc_{}_fn", p, s), {mix, hc * D}, 0.01f));
      base.push_back(mk.f32(fmt::format("{}.hc_{}_base", p, s), {mix}, 0.5f));
      base.push_back(mk.f32(fmt::format("{}.hc_{}_scale", p, s), {3}, 0.1f, 1.0f));
    }
    base.push_back(mk.f32(p + ".attn.attn_sink", {H}, 1.0f));
    mk.fp8(base, p + ".attn.wq_a", c.q_lora_rank, D);
    base.push_back(mk.bf16(p + ".attn.q_norm.weight", {c.q_lora_rank}, 0.1f, 1.0f));
    mk.fp8(base, p + ".attn.wq_b", H * hd, c.q_lora_rank);
    mk.fp8(base, p + ".attn.wkv", hd, D);
    base.push_back(mk.bf16(p + ".attn.kv_norm.weight", {hd}, 0.1f, 1.0f));
    mk.fp8(base, p + ".attn.wo_a", c.o_groups * c.o_lora_rank, H * hd / c.o_groups);
    mk.fp8(base, p + ".attn.wo_b", D, c.o_groups * c.o_lora_rank);
    auto compressor = [&](const std::string& q, int r, int d) {
      const int coff = r == 4 ? 2 : 1;
      base.push_back(mk.bf16(q + ".wkv.weight", {coff * d, D}, 1.0f / std::sqrt(float(D))));
      base.push_back(mk.bf16(q + ".wgate.weight", {coff * d, D}, 1.0f / std::sqrt(float(D))));
      base.push_back(mk.f32(q + ".ape", {r, coff * d}, 0.1f));
      base.push_back(mk.bf16(q + ".norm.weight", {d}, 0.1f, 1.0f));
    };
    if (ratio) compressor(p + ".attn.compressor", ratio, hd);
    if (ratio == 4) {
      mk.fp8(base, p + ".attn.indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
      base.push_back(mk.bf16(p + ".attn.indexer.weights_proj.weight", {c.index_n_heads, D}, 1.0f / std::sqrt(float(D))));
      compressor(p + ".attn.indexer.compressor", 4, c.index_head_dim);
    }
    base.push_back(mk.bf16(p + ".ffn.gate.weight", {E, D}, 1.0f / std::sqrt(float(D))));
    if (!mtp && layer < c.n_hash_layers) {
      std::mt19937 g(uint32_t(opts.seed * 7919 + uint64_t(layer)));
      std::vector<int32_t> t2e(size_t(V) * size_t(c.n_active_experts));
      std::vector<int32_t> perm(static_cast<size_t>(E));
      for (int v = 0; v < V; ++v) {
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), g);
        for (int k = 0; k < c.n_active_experts; ++k) t2e[size_t(v) * size_t(c.n_active_experts) + size_t(k)] = perm[size_t(k)];
      }
      base.push_back(make_tensor_out(p + ".ffn.gate.tid2eid", DType::I32, {V, c.n_active_experts}, t2e.data()));
    } else {
      base.push_back(mk.f32(p + ".ffn.gate.bias", {E}, 0.01f));
    }
    const bool layer_nv = nv && !mtp;
    if (layer_nv) layers_nv.push_back(layer);
    for (int e = 0; e < E; ++e) {
      std::string ep = fmt::format("{}.ffn.experts.{}", p, e);
      float g13 = 1.0f / 64, g2 = 1.0f / 64;  // NVFP4 global scales (w1/w3 share one)
      mk.fp4(experts, ep + ".w1", I, D, layer_nv, g13);
      mk.fp4(experts, ep + ".w2", D, I, layer_nv, g2);
      mk.fp4(experts, ep + ".w3", I, D, layer_nv, g13);
    }
    mk.fp8(base, p + ".ffn.shared_experts.w1", I, D);
    mk.fp8(base, p + ".ffn.shared_experts.w2", D, I);
    mk.fp8(base, p + ".ffn.shared_experts.w3", I, D);
  };
  for (int l = 0; l < c.n_layers; ++l) block(fmt::format("layers.{}", l), l, false);
  for (int m = 0; m < c.n_mtp_layers; ++m) {
    std::string p = fmt::format("mtp.{}", m);
    block(p, c.n_layers + m, true);
    mk.fp8(base, p + ".e_proj", D, D);
    mk.fp8(base, p + ".h_proj", D, D);
    for (auto* n : {".enorm.weight", ".hnorm.weight", ".norm.weight"}) base.push_back(mk.bf16(p + n, {D}, 0.1f, 1.0f));
    hc_head(p + ".");
  }
  if (nv) {
    json ql = json::object();
    for (int l : layers_nv) ql[fmt::format("layers.{}.ffn.experts", l)] = {{"quant_algo", "NVFP4"}, {"group_size", 16}};
    cfg["quantization_config"]["quantized_layers"] = ql;
    json excl = {"*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"};
    cfg["quantization_config"]["ignore"] = excl;
    write_json(fs::path(opts.out_dir) / "hf_quant_config.json",
               {{"producer", {{"name", "modelopt"}, {"version", "dsv4-nvfp4-experts"}}},
                {"quantization", {{"quant_algo", "MIXED_PRECISION"}, {"kv_cache_quant_algo", nullptr}, {"group_size", 16},
                                  {"quantized_layers", ql}, {"exclude_modules", excl}}}});
  }
  write_json(fs::path(opts.out_dir) / "config.json", cfg);
  const std::string s1 = "model-00001-of-00002.safetensors", s2 = "model-00002-of-00002.safetensors";
  json wm = json::object();
  size_t total = 0;
  for (auto& t : base) wm[t.name] = s1, total += t.bytes.size();
  for (auto& t : experts) wm[t.name] = s2, total += t.bytes.size();
  write_safetensors((fs::path(opts.out_dir) / s1).string(), base, {{"format", "pt"}});
  write_safetensors((fs::path(opts.out_dir) / s2).string(), experts, {{"format", "pt"}});
  write_json(fs::path(opts.out_dir) / "model.safetensors.index.json", {{"metadata", {{"total_size", total}}}, {"weight_map", wm}});
  return int(base.size() + experts.size());
}

}  // namespace dsv4
