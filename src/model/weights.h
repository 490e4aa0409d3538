// Tensor names of a DeepSeek-V4 checkpoint (SPEC §5.1, §5.3) → per-layer weight structs.
// Every tensor the config implies is checked (present, dtype, shape) when the structs are built;
// the views point into the mapped checkpoint (no copies), except where a conversion is needed.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/model_config.h"
#include "checkpoint/safetensors.h"

namespace dsv4 {

// y = x·Wᵀ with W [out, in] in one of the checkpoint formats.
struct LinearWeight {
  std::string name;  // checkpoint prefix, e.g. "layers.3.attn.wq_a"
  WeightFormat format = WeightFormat::BF16;
  int out = 0, in = 0;
  const uint8_t* w = nullptr;      // bf16 [out,in] | e4m3 [out,in] | packed e2m1 [out,in/2]
  const uint8_t* scale = nullptr;  // FP8: ue8m0 [⌈out/128⌉,⌈in/128⌉]; MXFP4: ue8m0 [out,in/32]; NVFP4: e4m3 [out,in/16]
  float scale2 = 1.0f;             // NVFP4 global weight scale (weight_scale_2)
};

struct CompressorWeights {
  int ratio = 0, head_dim = 0, coff = 1;  // coff = 2 for the overlapping ratio-4 compressor
  bool rotate = false;                    // indexer compressor: Hadamard + FP4 simulation
  const uint16_t* wkv = nullptr;          // bf16 [coff·d, D]
  const uint16_t* wgate = nullptr;        // bf16 [coff·d, D]
  const float* ape = nullptr;             // f32 [ratio, coff·d]
  const uint16_t* norm = nullptr;         // bf16 [d]
};

struct IndexerWeights {
  LinearWeight wq_b;                       // [n_heads·128, q_lora]
  const uint16_t* weights_proj = nullptr;  // bf16 [n_heads, D]
  CompressorWeights compressor;
};

struct AttentionWeights {
  LinearWeight wq_a, wq_b, wkv, wo_b;
  std::vector<uint16_t> wo_a;  // bf16 [o_groups·o_lora, H·d/o_groups] (the reference runs it in bf16)
  const uint16_t* q_norm = nullptr;
  const uint16_t* kv_norm = nullptr;
  const float* sink = nullptr;  // [H]
  CompressorWeights compressor;  // ratio > 0
  IndexerWeights indexer;        // ratio == 4
};

struct ExpertWeights {
  LinearWeight w1, w2, w3;  // gate, down, up
};

struct MoeWeights {
  const uint16_t* gate = nullptr;  // bf16 [E, D]
  const float* bias = nullptr;     // f32 [E] (learned routing)
  std::vector<int32_t> tid2eid;    // [vocab, k] (hash routing)
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
};

struct HyperConnection {
  const float* fn = nullptr;     // [(2+hc)·hc, hc·D] or [hc, hc·D] for the head
  const float* base = nullptr;
  const float* scale = nullptr;
};

struct BlockWeights {
  int layer = 0;   // index into compress_ratios (main layers, then MTP)
  int ratio = 0;   // 0 SWA, 4 CSA, 128 HCA
  bool hash_routed = false;
  const uint16_t* attn_norm = nullptr;
  const uint16_t* ffn_norm = nullptr;
  HyperConnection hc_attn, hc_ffn;
  AttentionWeights attn;
  MoeWeights moe;
};

struct MtpWeights {
  BlockWeights block;
  LinearWeight e_proj, h_proj;
  const uint16_t* enorm = nullptr;
  const uint16_t* hnorm = nullptr;
  const uint16_t* norm = nullptr;
  HyperConnection hc_head;
};

struct ModelWeights {
  ModelConfig config;
  std::shared_ptr<Checkpoint> checkpoint;  // keeps the mappings alive
  const uint16_t* embed = nullptr;         // bf16 [V, D]
  const uint16_t* head = nullptr;          // bf16 [V, D]
  const uint16_t* norm = nullptr;
  HyperConnection hc_head;
  std::vector<BlockWeights> blocks;
  std::vector<MtpWeights> mtp;
  std::vector<std::string> unused_tensors;  // present in the checkpoint, not used
};

// Loads config + checkpoint from DIR and builds the structs; throws Error on any mismatch.
std::unique_ptr<ModelWeights> load_model_weights(const std::string& dir);

}  // namespace dsv4
