// Device copies of repacked FP4 expert layers and the MoE forward's scratch (backend/cuda/moe_fp4.h).
#include <algorithm>

#include "backend/cuda/moe_fp4.h"
#include "backend/cuda/moe_fp4_repack.h"
#include "core/error.h"

namespace dsv4::cuda {

MoeFp4Weights::MoeFp4Weights(const MoeFp4Shape& shape) : shape_(shape) {
  const int sbytes = moe_unit_scale_bytes(shape.format);
  const size_t gu_units = size_t(2 * shape.inter / kMoeUnitRows) * (shape.hidden / kMoeUnitCols);
  const size_t dn_units = size_t(shape.hidden / kMoeUnitRows) * (shape.inter / kMoeUnitCols);
  gate_up_ = DeviceBuffer<uint8_t>(shape.experts * gu_units * kMoeUnitBytes);
  gate_up_scales_ = DeviceBuffer<uint8_t>(shape.experts * gu_units * sbytes);
  down_ = DeviceBuffer<uint8_t>(shape.experts * dn_units * kMoeUnitBytes);
  down_scales_ = DeviceBuffer<uint8_t>(shape.experts * dn_units * sbytes);
  factors_ = DeviceBuffer<float>(size_t(shape.experts) * kFactorsPerExpert);
  if (shape.format == MoeFp4Format::Mxfp4) {
    w4a8_gate_up_index_ = DeviceBuffer<uint8_t>(shape.experts * gu_units * sbytes);
    w4a8_down_index_ = DeviceBuffer<uint8_t>(shape.experts * dn_units * sbytes);
    w4a8_gate_up_row_scale_ = DeviceBuffer<float>(size_t(shape.experts) * shape.inter * 2);
    w4a8_down_row_scale_ = DeviceBuffer<float>(size_t(shape.experts) * shape.hidden);
  }
}

MoeFp4Weights::MoeFp4Weights(const MoeFp4Repacked& rp, cudaStream_t stream) : MoeFp4Weights(rp.shape) {
  gate_up_.upload(rp.gate_up, stream);
  gate_up_scales_.upload(rp.gate_up_scales, stream);
  down_.upload(rp.down, stream);
  down_scales_.upload(rp.down_scales, stream);
  factors_.upload(rp.factors, stream);
  if (has_w4a8()) {
    w4a8_gate_up_index_.upload(rp.w4a8_gate_up_index, stream);
    w4a8_down_index_.upload(rp.w4a8_down_index, stream);
    w4a8_gate_up_row_scale_.upload(rp.w4a8_gate_up_row_scale, stream);
    w4a8_down_row_scale_.upload(rp.w4a8_down_row_scale, stream);
  }
  DSV4_CUDA_CHECK(cudaStreamSynchronize(stream));  // the host vectors die with the caller
}

MoeFp4Weights::MoeFp4Weights(const MoeFp4Shape& shape, const std::vector<MoeFp4ExpertTensors>& experts,
                             cudaStream_t stream)
    : MoeFp4Weights(allocate(shape)) {
  moe_fp4_repack_device(experts, *this, stream);
}

MoeFp4Weights MoeFp4Weights::allocate(const MoeFp4Shape& shape) {
  if (shape.hidden % 128 || shape.inter % 128 || shape.experts <= 0 || shape.experts > 1024)
    fail("MoeFp4Weights: unsupported shape E {} D {} I {}", shape.experts, shape.hidden, shape.inter);
  return MoeFp4Weights(shape);
}

size_t MoeFp4Weights::expert_bytes() const {
  return (gate_up_.bytes() + gate_up_scales_.bytes() + down_.bytes() + down_scales_.bytes()) / shape_.experts;
}

MoeWorkspace::MoeWorkspace(const MoeFp4Shape& shape, int max_tokens, int k)
    : active_count(1),
      slot_expert(shape.experts),
      slot_begin(shape.experts),
      slot_count(shape.experts),
      sorted_pairs(size_t(std::max(max_tokens, 1)) * k),
      pass_total(1),
      pass_expert(size_t(shape.experts) + size_t(std::max(max_tokens, 1)) * k),
      pass_begin(size_t(shape.experts) + size_t(std::max(max_tokens, 1)) * k),
      pass_rows(size_t(shape.experts) + size_t(std::max(max_tokens, 1)) * k),
      hidden_act(size_t(std::max(max_tokens, 1)) * k * shape.inter),
      expert_out(size_t(std::max(max_tokens, 1)) * k * shape.hidden),
      max_tokens_(max_tokens),
      k_(k) {
  if (moe_fp4_path_available(MoeFp4Path::W4A8, shape)) {  // MXFP4 on an sm_90 GPU: nothing to hold elsewhere
    const size_t elems = std::max(size_t(std::max(max_tokens, 1)) * shape.hidden,
                                  size_t(std::max(max_tokens, 1)) * k * shape.inter);
    act_fp8 = DeviceBuffer<uint8_t>(elems);
    act_scale = DeviceBuffer<float>(elems / 128);
  }
}

}  // namespace dsv4::cuda
