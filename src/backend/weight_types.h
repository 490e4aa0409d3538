// The weight descriptors the backend's ops take (DESIGN §3.3). The loader (model/weights) binds
// them to the mapped checkpoint and, given a backend, points them at the copies Backend::place_weight
// made (the CPU backend keeps reading the mapping). Every pointer is then backend memory, read only
// by the backend that placed it — except the routed experts' LinearWeights, which stay host views
// for Backend::prepare_experts (MoeWeights::prepared holds the backend's form).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/weight_format.h"

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
  // This rank's query heads and output groups (tensor parallelism shards them; all of them
  // otherwise): wq_b, sink and wo_a hold exactly these, wo_b the matching input columns.
  int n_heads = 0, o_groups = 0;
  LinearWeight wq_a, wq_b, wkv, wo_b;
  // [o_groups·o_lora, H·d/o_groups], as the checkpoint stores it (FP8_BLOCK in the official ones): the
  // reference converts it to bf16 at load and runs a bf16 einsum; Backend::grouped_out_proj uses
  // those bf16 values (e4m3 × a power-of-two scale is exact in bf16) without storing them.
  LinearWeight wo_a;
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
  // The router chooses among n_routed experts; experts[i] is expert expert_begin + i. Expert
  // parallelism binds a rank's n_routed / world experts only; otherwise all of them, from 0.
  int n_routed = 0, expert_begin = 0;
  const uint16_t* gate = nullptr;  // bf16 [E, D]
  const float* bias = nullptr;     // f32 [E] (learned routing)
  const int32_t* hash_table = nullptr;  // tid2eid [vocab, k] (hash routing), backend memory
  std::shared_ptr<std::vector<int32_t>> hash_table_host;  // the loader's int32 copy it first points into
  // The routed experts in the backend's kernel layout (Backend::place_weights); null on the CPU.
  std::shared_ptr<void> prepared;
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
};

struct HyperConnection {
  const float* fn = nullptr;     // [(2+hc)·hc, hc·D] or [hc, hc·D] for the head
  const float* base = nullptr;
  const float* scale = nullptr;
};

}  // namespace dsv4
