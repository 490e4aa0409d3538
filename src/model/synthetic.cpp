#include "model/synthetic.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "checkpoint/safetensors.h"
#include "core/dtypes.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "model/make_tiny.h"

namespace dsv4 {

using json = nlohmann::json;

namespace {

// SPEC §1.1 (Flash) and §1.2: layers 0, 1 SWA, then CSA / HCA alternating, the last main layer CSA.
json flash_config() {
  json c = default_tiny_config();  // every field but the shape
  const json flash = {{"hidden_size", 4096}, {"num_hidden_layers", 43}, {"num_attention_heads", 64},
                           {"q_lora_rank", 1024}, {"o_groups", 8}, {"o_lora_rank", 1024}, {"index_n_heads", 64},
                           {"index_topk", 512}, {"n_routed_experts", 256}, {"moe_intermediate_size", 2048},
                           {"routed_scaling_factor", 1.5}, {"num_hash_layers", 3}};
  for (auto& [k, v] : flash.items()) c[k] = v;
  std::vector<int> ratios = {0, 0};
  for (int l = 2; l < 43; ++l) ratios.push_back(l % 2 == 0 ? 4 : 128);
  ratios.push_back(0);  // MTP
  c["compress_ratios"] = ratios;
  return c;
}

bool ends_with(const std::string& s, const std::string& t) { return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0; }

// splitmix64: a counter-based generator, so tensors fill in parallel chunks reproducibly.
inline uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Uniform in [-1, 1) from 24 bits.
inline float unit(uint64_t r) { return float(int32_t(r & 0xffffff) - 0x800000) / float(0x800000); }

int64_t count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}
}  // namespace

SyntheticSource::SyntheticSource(const std::string& spec) : spec_(spec) {
  std::string rest = spec.substr(std::string("synthetic:").size());
  std::vector<std::string> parts;
  for (size_t i = 0; i <= rest.size();) {
    size_t j = rest.find(',', i);
    if (j == std::string::npos) j = rest.size();
    parts.push_back(rest.substr(i, j - i));
    i = j + 1;
  }
  json cfg;
  if (parts[0] == "flash") cfg = flash_config();
  else if (parts[0] == "tiny") cfg = default_tiny_config();  // the fixtures' shape
  else fail("{}: unknown synthetic model '{}' (flash or tiny)", spec, parts[0]);
  for (size_t i = 1; i < parts.size(); ++i) {
    const size_t eq = parts[i].find('=');
    if (eq == std::string::npos || eq == 0) fail("{}: '{}' is not key=value", spec, parts[i]);
    const std::string key = parts[i].substr(0, eq), value = parts[i].substr(eq + 1);
    if (key == "layers") {
      int n = 0;
      try {
        n = std::stoi(value);
      } catch (const std::exception&) {
        n = 0;
      }
      const int have = cfg["num_hidden_layers"].get<int>();
      if (n < 1 || n > have) fail("{}: layers={} (1..{})", spec, value, have);
      std::vector<int> r = cfg["compress_ratios"].get<std::vector<int>>();
      std::vector<int> kept(r.begin(), r.begin() + n);
      kept.push_back(r.back());  // the MTP layer
      cfg["compress_ratios"] = kept;
      cfg["num_hidden_layers"] = n;
      cfg["num_hash_layers"] = std::min(n, cfg["num_hash_layers"].get<int>());
    } else if (key == "experts") {
      if (value == "nvfp4") {
        cfg["quantization_config"]["quant_algo"] = "MIXED_PRECISION";
        cfg["quantization_config"]["moe_quant_algo"] = "NVFP4";
        cfg["quantization_config"]["group_size"] = 16;
      } else if (value != "mxfp4") {
        fail("{}: experts={} (mxfp4 or nvfp4)", spec, value);
      }
    } else if (key == "seed") {
      try {
        seed_ = std::stoull(value);
      } catch (const std::exception&) {
        fail("{}: seed={} is not a number", spec, value);
      }
    } else {
      if (!cfg.contains(key)) fail("{}: unknown option or config field '{}' (layers, experts, seed, or SPEC §1.1 names)", spec, key);
      try {
        cfg[key] = json::parse(value);
      } catch (const json::exception&) {
        cfg[key] = value;
      }
    }
  }
  config_json_ = cfg.dump(2);
  config_ = parse_model_config(config_json_, "", spec);
}

bool SyntheticSource::has(const std::string& name) const {
  return !ends_with(name, ".input_scale");  // the optional NVFP4 static activation scale
}

bool SyntheticSource::release_bound() {
  refs_.clear();
  bytes_.clear();
  return true;
}

const TensorRef* SyntheticSource::find(const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
  const int64_t n = count(shape);
  std::vector<uint8_t>& b = bytes_.emplace_back(size_t(n) * dtype_size(dtype));
  const uint64_t stream = mix(seed_ * 0x100000001b3ull + ++counter_);
  const int64_t fan_in = shape.size() >= 2 ? shape[1] : 1;
  // Fills element i from its own random number, in parallel chunks.
  auto fill = [&](auto&& value_of) {
    parallel_for(n, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) value_of(i, mix(stream ^ uint64_t(i) * 0xd1342543de82ef95ull));
    });
  };
  auto code_e8m0 = [](float v) { return uint8_t(std::clamp(127 + int(std::lround(std::log2(v))), 1, 254)); };
  const bool norm = ends_with(name, "norm.weight");
  switch (dtype) {
    case DType::BF16: {
      // Norm weights ~1; the embedding ~1 (the reference's scale); matrices ~1/sqrt(fan-in).
      const float amp = norm ? 0.1f : name == "embed.weight" ? std::sqrt(3.0f) : std::sqrt(3.0f / float(fan_in));
      const float mean = norm ? 1.0f : 0.0f;
      auto* p = reinterpret_cast<uint16_t*>(b.data());
      fill([&](int64_t i, uint64_t r) { p[i] = f32_to_bf16(mean + amp * unit(r)); });
      break;
    }
    case DType::F32: {
      float amp = 0.01f, mean = 0;
      if (ends_with(name, "_base")) amp = 0.5f;
      else if (ends_with(name, "_scale")) amp = 0.1f, mean = 1;
      else if (ends_with(name, "attn_sink")) amp = 1;
      else if (ends_with(name, ".ape")) amp = 0.1f;
      else if (ends_with(name, "weight_scale_2")) amp = 0, mean = 1.0f / 64;
      auto* p = reinterpret_cast<float*>(b.data());
      fill([&](int64_t i, uint64_t r) { p[i] = mean + amp * unit(r); });
      break;
    }
    case DType::F8_E4M3: {
      auto* p = b.data();
      if (ends_with(name, ".weight_scale")) {  // NVFP4 block scales: with weight_scale_2 = 1/64, ~1/(3·sqrt(fan-in))
        const uint8_t c = f32_to_e4m3(64.0f / (3.0f * std::sqrt(float(fan_in * 16))));
        std::memset(p, c, b.size());
      } else {  // FP8 weights: magnitudes 2^-2 .. 2^1.9, random signs and mantissas (rms ~1.3)
        fill([&](int64_t i, uint64_t r) { p[i] = uint8_t((r & 0x87) | (((r >> 3) & 3) + 5) << 3); });
      }
      break;
    }
    case DType::F8_E8M0: {
      // FP8 block scales (fan-in = blocks · 128) put weights at ~1/sqrt(fan-in); MXFP4 scales (per
      // 32) put e2m1 values (rms ~2.9) there too.
      const bool fp4 = name.find(".experts.") != std::string::npos;
      const float in = float(fan_in * (fp4 ? 32 : 128));
      std::memset(b.data(), code_e8m0(1.0f / ((fp4 ? 2.9f : 1.3f) * std::sqrt(in))), b.size());
      break;
    }
    case DType::I8:
    case DType::U8: {  // packed e2m1 pairs: every code
      auto* p = b.data();
      fill([&](int64_t i, uint64_t r) { p[i] = uint8_t(r); });
      break;
    }
    case DType::I32: {  // tid2eid: distinct experts per token
      DSV4_CHECK(shape.size() == 2, "{}: synthetic I32 tensors are hash tables", name);
      const int E = config_.n_routed_experts, k = int(shape[1]);
      auto* p = reinterpret_cast<int32_t*>(b.data());
      parallel_for(shape[0], [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          uint64_t r = mix(stream ^ uint64_t(t));
          for (int j = 0; j < k; ++j) {
            int32_t e;
            do {
              r = mix(r);
              e = int32_t(r % uint64_t(E));
            } while (std::find(p + t * k, p + t * k + j, e) != p + t * k + j);
            p[t * k + j] = e;
          }
        }
      });
      break;
    }
    default:
      fail("{}: no synthetic values for dtype {}", name, dtype_name(dtype));
  }
  TensorRef& t = refs_.emplace_back();
  t.name = name;
  t.dtype = dtype;
  t.shape = shape;
  t.data = b.data();
  t.nbytes = b.size();
  t.file = spec_;
  return &t;
}

std::unique_ptr<SyntheticSource> make_synthetic_source(const std::string& spec) {
  return std::make_unique<SyntheticSource>(spec);
}

int write_synthetic_checkpoint(const std::string& spec, const std::string& out_dir, size_t shard_bytes) {
  namespace fs = std::filesystem;
  SyntheticSource src(spec);
  // The binder asks for every tensor the config implies, by its checkpoint name: exactly what a
  // checkpoint of this shape holds.
  (void)bind_model_weights(src.config(), src, nullptr, nullptr);
  std::vector<std::vector<const TensorRef*>> shards(1);
  size_t in_shard = 0, total = 0;
  for (const TensorRef& t : src.made()) {
    if (in_shard && in_shard + t.nbytes > shard_bytes) shards.emplace_back(), in_shard = 0;
    shards.back().push_back(&t);
    in_shard += t.nbytes, total += t.nbytes;
  }
  fs::create_directories(out_dir);
  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    log_info("writing {} ({} tensors)", file, shards[i].size());
    write_safetensors((fs::path(out_dir) / file).string(), shards[i], {{"format", "pt"}});
    for (const TensorRef* t : shards[i]) weight_map[t->name] = file;
  }
  auto write_text = [&](const std::string& name, const std::string& text) {
    std::ofstream f(fs::path(out_dir) / name);
    f << text << "\n";
    if (!f) fail("{}: write failed", (fs::path(out_dir) / name).string());
  };
  write_text("config.json", src.config_json());
  write_text("model.safetensors.index.json",
             json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2));
  return int(src.made().size());
}

}  // namespace dsv4
