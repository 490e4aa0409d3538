// Random-weight models of a real shape, for measuring without a checkpoint: "synthetic:flash" is
// DeepSeek-V4-Flash (SPEC §1.1, its layer schedule §1.2), "synthetic:tiny" the fixtures' shape
// (what make-tiny writes). Options follow as ",key=value": layers=N (the schedule's first N main
// layers, then the MTP layer), experts=mxfp4|nvfp4, seed=K, or any config.json field
// (n_routed_experts=64, ...). Every tensor is made as the loader asks for it, valid by construction
// (scales in range, distinct hash-routing experts, weights scaled ~1/sqrt(fan-in) so activations
// stay finite and routing spreads over the experts), and goes through the real loader: placement,
// the GPU repack of the routed experts, the load log and its progress bar. Values are a function
// of (seed, tensor, element) (backend/random_fill.h), made in the backend's memory where the
// tensor will live — the same bytes as on the host, so `make-tiny --like` writes this very model.
#pragma once
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/random_fill.h"
#include "checkpoint/model_config.h"
#include "model/weights.h"

namespace dsv4 {

class SyntheticSource final : public TensorSource {
 public:
  // With a backend, every tensor the binder places or prepares is made in its memory
  // (Backend::generate: on the GPU, no host copy); the rest (and everything without one) on the host.
  explicit SyntheticSource(const std::string& spec, Backend* backend = nullptr);
  const ModelConfig& config() const { return config_; }
  const TensorRef* find(const std::string& name, DType dtype, const std::vector<int64_t>& shape, TensorUse use) override;
  // With a backend: the window's elements, each the value it has in the whole tensor.
  const TensorRef* find_window(const std::string& name, DType dtype, const std::vector<int64_t>& shape, TensorUse use,
                               const Window& window) override;
  bool has(const std::string& name) const override;
  std::string where() const override { return spec_; }
  bool release_bound() override;
  // Every tensor made so far, in the order asked for (until release_bound), and the config as
  // config.json text.
  const std::deque<TensorRef>& made() const { return refs_; }
  const std::string& config_json() const { return config_json_; }

 private:
  std::string spec_;
  ModelConfig config_;
  std::string config_json_;
  uint64_t seed_ = 1;
  RandomFill fill_of(const std::string& name, DType dtype, const std::vector<int64_t>& shape) const;
  Backend* backend_ = nullptr;
  std::deque<TensorRef> refs_;
  std::deque<std::vector<uint8_t>> bytes_;
  std::deque<Tensor> placed_, prepared_;  // made in the backend: the model's weights; the experts' raw form
};

std::unique_ptr<SyntheticSource> make_synthetic_source(const std::string& spec, Backend* backend = nullptr);

// Writes the synthetic model `spec` to `out_dir` as a checkpoint in the official format
// (config.json, shards of at most `shard_bytes`, model.safetensors.index.json): a full-size
// checkpoint on disk to measure loading on. Returns the number of tensors written.
int write_synthetic_checkpoint(const std::string& spec, const std::string& out_dir, size_t shard_bytes = size_t(4) << 30);

}  // namespace dsv4
