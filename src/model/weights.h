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
#include "backend/backend.h"
#include "model/parallel_layout.h"

namespace dsv4 {

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
  ParallelLayout layout;                   // this rank's share of the model (all of it when world = 1)
  std::shared_ptr<Checkpoint> checkpoint;  // keeps the mappings alive
  std::shared_ptr<void> source;            // keeps a generated model's host bytes alive (where they are the weights)
  std::vector<std::shared_ptr<void>> shard_copies;  // a rank's column slices (host copies the structs may point into)
  const uint16_t* embed = nullptr;         // bf16 [V, D]
  const uint16_t* head = nullptr;          // bf16 [V, D]
  const uint16_t* norm = nullptr;
  HyperConnection hc_head;
  std::vector<BlockWeights> blocks;
  std::vector<MtpWeights> mtp;
  std::vector<std::string> unused_tensors;  // present in the checkpoint, not used
  size_t tensors_bound = 0;                 // tensors the model uses, and their bytes as stored
  double bytes_bound = 0;
  std::vector<double> block_bytes, expert_bytes;  // per main block: all its bytes, one routed expert's
};

// Where the binder finds tensors by name: a checkpoint, or the synthetic model's generator
// (model/synthetic.h), which makes each tensor as it is asked for.
// How the binder uses a tensor: placed in backend memory for the model's lifetime, read on the
// host (converted or a scalar), or handed to Backend::prepare_experts (which makes its own form).
enum class TensorUse { Placed, HostRead, Prepared };

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // The tensor `name`, or nullptr; `dtype` and `shape` are what the binder expects (a generator
  // makes exactly that; a checkpoint returns what it has and the binder checks it). A generator
  // may make a Placed or Prepared tensor in backend memory (TensorRef::in_backend).
  virtual const TensorRef* find(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                                TensorUse use) = 0;
  // Rows [row0, row0 + rows) × stored columns [col0, col0 + cols) of the 2-D tensor `name` (of
  // `shape`), made in backend memory for a Placed or Prepared use — a tensor-parallel rank's slice,
  // without the rest of the tensor — or nullptr where the source cannot (a checkpoint: the binder
  // cuts the slice from its host view).
  struct Window {
    int64_t row0 = 0, rows = 0, col0 = 0, cols = 0;
  };
  virtual const TensorRef* find_window(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                                       TensorUse use, const Window& window) {
    return nullptr;
  }
  virtual bool has(const std::string& name) const = 0;
  virtual std::string where() const = 0;  // for messages
  // Frees the host bytes of the tensors returned so far (the backend holds its own copies); true
  // when it did (a checkpoint's mapping stays).
  virtual bool release_bound() { return false; }
};

// Loads config + checkpoint from DIR and builds the structs; throws Error on any mismatch. With a
// backend, the weights are placed in its memory as they are bound and the routed experts prepared
// (the structs then point into backend memory); without one they are views into the mapping.
// DIR "synthetic:NAME[,key=value...]" is a random-weight model of that shape (model/synthetic.h).
// With a split `layout`, only this rank's share of the sharded tensors is bound and placed
// (parallel_layout.h; the layout must fit the config: parallel_layout_problem).
std::unique_ptr<ModelWeights> load_model_weights(const std::string& dir, Backend* backend = nullptr,
                                                 const ParallelLayout& layout = {});
// The binding itself, from any source.
std::unique_ptr<ModelWeights> bind_model_weights(const ModelConfig& config, TensorSource& src, Backend* backend,
                                                 std::shared_ptr<Checkpoint> checkpoint, const ParallelLayout& layout = {});

}  // namespace dsv4
