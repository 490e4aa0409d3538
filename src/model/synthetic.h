// Random-weight models of a real shape, for measuring without a checkpoint: "synthetic:flash" is
// DeepSeek-V4-Flash (SPEC §1.1, its layer schedule §1.2), "synthetic:tiny" the fixtures' shape
// (what make-tiny writes). Options follow as ",key=value": layers=N (the schedule's first N main
// layers, then the MTP layer), experts=mxfp4|nvfp4, seed=K, or any config.json field
// (n_routed_experts=64, ...). Every tensor is made as the loader asks for it, valid by construction
// (scales in range, distinct hash-routing experts, weights scaled ~1/sqrt(fan-in) so activations
// stay finite and routing spreads over the experts), and goes through the real loader: placement,
// the GPU repack of the routed experts, the load log and its progress bar.
#pragma once
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/model_config.h"
#include "model/weights.h"

namespace dsv4 {

class SyntheticSource final : public TensorSource {
 public:
  explicit SyntheticSource(const std::string& spec);
  const ModelConfig& config() const { return config_; }
  const TensorRef* find(const std::string& name, DType dtype, const std::vector<int64_t>& shape) override;
  bool has(const std::string& name) const override;
  std::string where() const override { return spec_; }
  bool release_bound() override;

 private:
  std::string spec_;
  ModelConfig config_;
  uint64_t seed_ = 1;
  uint64_t counter_ = 0;  // one stream of random numbers per tensor
  std::deque<TensorRef> refs_;
  std::deque<std::vector<uint8_t>> bytes_;
};

std::unique_ptr<SyntheticSource> make_synthetic_source(const std::string& spec);

}  // namespace dsv4
