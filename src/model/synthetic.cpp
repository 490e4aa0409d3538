#include "model/synthetic.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "backend/random_fill.h"
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

int64_t count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}
}  // namespace

SyntheticSource::SyntheticSource(const std::string& spec, Backend* backend) : spec_(spec), backend_(backend) {
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
  prepared_.clear();
  return true;
}

// How the tensor `name` is made. One stream of random numbers per tensor, from its name: a
// tensor-parallel rank that skips another rank's experts makes every other tensor as rank 0 does.
RandomFill SyntheticSource::fill_of(const std::string& name, DType dtype, const std::vector<int64_t>& shape) const {
  uint64_t name_hash = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char ch : name) name_hash = (name_hash ^ ch) * 0x100000001b3ull;
  const uint64_t stream = random_mix(seed_ * 0x100000001b3ull ^ name_hash);
  const int64_t fan_in = shape.size() >= 2 ? shape[1] : 1;
  auto code_e8m0 = [](float v) { return uint8_t(std::clamp(127 + int(std::lround(std::log2(v))), 1, 254)); };
  const bool norm = ends_with(name, "norm.weight");
  RandomFill f;
  f.stream = stream;
  switch (dtype) {
    case DType::BF16:
      // Norm weights ~1; the embedding ~1 (the reference's scale); matrices ~1/sqrt(fan-in).
      f.kind = RandomFill::Kind::Bf16Uniform;
      f.amp = norm ? 0.1f : name == "embed.weight" ? std::sqrt(3.0f) : std::sqrt(3.0f / float(fan_in));
      f.mean = norm ? 1.0f : 0.0f;
      break;
    case DType::F32:
      f.kind = RandomFill::Kind::F32Uniform;
      f.amp = 0.01f;
      if (ends_with(name, "_base")) f.amp = 0.5f;
      else if (ends_with(name, "_scale")) f.amp = 0.1f, f.mean = 1;
      else if (ends_with(name, "attn_sink")) f.amp = 1;
      else if (ends_with(name, ".ape")) f.amp = 0.1f;
      else if (ends_with(name, "weight_scale_2")) f.amp = 0, f.mean = 1.0f / 64;
      break;
    case DType::F8_E4M3:
      if (ends_with(name, ".weight_scale")) {  // NVFP4 block scales: with weight_scale_2 = 1/64, ~1/(3·sqrt(fan-in))
        f.kind = RandomFill::Kind::Constant;
        f.byte = f32_to_e4m3(64.0f / (3.0f * std::sqrt(float(fan_in * 16))));
      } else {
        f.kind = RandomFill::Kind::Fp8Weight;
      }
      break;
    case DType::F8_E8M0: {
      // FP8 block scales (fan-in = blocks · 128) put weights at ~1/sqrt(fan-in); MXFP4 scales (per
      // 32) put e2m1 values (rms ~2.9) there too.
      const bool fp4 = name.find(".experts.") != std::string::npos;
      const float in = float(fan_in * (fp4 ? 32 : 128));
      f.kind = RandomFill::Kind::Constant;
      f.byte = code_e8m0(1.0f / ((fp4 ? 2.9f : 1.3f) * std::sqrt(in)));
      break;
    }
    case DType::I8:
    case DType::U8:  // packed e2m1 pairs: every code
      f.kind = RandomFill::Kind::Bytes;
      break;
    case DType::I32: break;  // below
    default:
      fail("{}: no synthetic values for dtype {}", name, dtype_name(dtype));
  }
  return f;
}

const TensorRef* SyntheticSource::find(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                                       TensorUse use) {
  const int64_t n = count(shape);
  const RandomFill f = fill_of(name, dtype, shape);
  TensorRef& t = refs_.emplace_back();
  t.name = name;
  t.dtype = dtype;
  t.shape = shape;
  t.file = spec_;
  t.nbytes = size_t(n) * dtype_size(dtype);
  if (dtype != DType::I32 && backend_ && use != TensorUse::HostRead) {
    Tensor made = backend_->generate(f, dtype, shape);
    t.data = static_cast<const uint8_t*>(made.data);
    t.in_backend = true;
    (use == TensorUse::Placed ? placed_ : prepared_).push_back(std::move(made));
    return &t;
  }
  std::vector<uint8_t>& b = bytes_.emplace_back(t.nbytes);
  t.data = b.data();
  if (dtype != DType::I32) {
    random_fill_reference(f, b.data(), n);
    return &t;
  }
  // tid2eid: distinct experts per token.
  DSV4_CHECK(shape.size() == 2, "{}: synthetic I32 tensors are hash tables", name);
  const int E = config_.n_routed_experts, k = int(shape[1]);
  auto* p = reinterpret_cast<int32_t*>(b.data());
  parallel_for(shape[0], [&](int64_t t0, int64_t t1) {
    for (int64_t tok = t0; tok < t1; ++tok) {
      uint64_t r = random_mix(f.stream ^ uint64_t(tok));
      for (int j = 0; j < k; ++j) {
        int32_t e;
        do {
          r = random_mix(r);
          e = int32_t(r % uint64_t(E));
        } while (std::find(p + tok * k, p + tok * k + j, e) != p + tok * k + j);
        p[tok * k + j] = e;
      }
    }
  });
  return &t;
}

const TensorRef* SyntheticSource::find_window(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                                              TensorUse use, const Window& w) {
  if (!backend_ || use == TensorUse::HostRead || dtype == DType::I32 || shape.size() != 2) return nullptr;
  DSV4_CHECK(w.row0 >= 0 && w.rows > 0 && w.row0 + w.rows <= shape[0] && w.col0 >= 0 && w.cols > 0 &&
                 w.col0 + w.cols <= shape[1],
             "{}: window rows {}+{} × columns {}+{} outside {}", name, w.row0, w.rows, w.col0, w.cols, shape_str(shape));
  RandomFill f = fill_of(name, dtype, shape);
  f.cols = w.cols;
  f.source_cols = shape[1];
  f.row0 = w.row0;
  f.col0 = w.col0;
  TensorRef& t = refs_.emplace_back();
  t.name = name;
  t.dtype = dtype;
  t.shape = {w.rows, w.cols};
  t.file = spec_;
  t.nbytes = size_t(w.rows * w.cols) * dtype_size(dtype);
  Tensor made = backend_->generate(f, dtype, t.shape);
  t.data = static_cast<const uint8_t*>(made.data);
  t.in_backend = true;
  (use == TensorUse::Placed ? placed_ : prepared_).push_back(std::move(made));
  return &t;
}

std::unique_ptr<SyntheticSource> make_synthetic_source(const std::string& spec, Backend* backend) {
  return std::make_unique<SyntheticSource>(spec, backend);
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
