// Load-time repack of a layer's FP4 routed experts on the GPU: the tensors exactly as the checkpoint
// stores them (MXFP4 or NVFP4, MoeFp4ExpertTensors) are copied unchanged into a device staging
// buffer, and two kernels write every buffer of MoeFp4Weights in the unit layout of
// backend/moe_fp4_layout.h, byte for byte what the CPU twin moe_fp4_repack produces
// (tests/ops/moe_fp4_repack_gpu_test.cu):
//
//   scan   one block per (expert, matrix): validates the scale codes (and weight_scale_2) and
//          writes the matrix factor (MXFP4: 2^g from the largest code; NVFP4: weight_scale_2 · 2^8);
//   units  one block per 16-row tile of one expert's gate-up or down matrix: the tile's W4A8 row
//          factors (MXFP4), then per 16 × 64 unit the e2m1 words, the stored scale bytes and the
//          W4A8 table indices.
//
// Host work is one cudaMemcpyAsync per tensor. A layer too large for the staging budget goes
// through in chunks of experts that reuse one staging buffer: the stream orders each chunk's copies
// after the previous chunk's kernels, so nothing waits on the host until the layer's status is read.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cpu/moe_fp4_reference.h"
#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/device_limits.h"

namespace dsv4::cuda {

class MoeFp4Weights;

// Staging for the on-disk tensors of up to `capacity` experts of one shape. Per source matrix m
// (0 = w1, 1 = w3, 2 = w2: the MoeFactor order) the packed e2m1 bytes of the staged experts back to
// back, then per m their scale codes, then weight_scale_2 as f32 [expert][m]. The three matrices
// have the same sizes ([I, D/2] and [D, I/2]; [I, D/group] and [D, I/group]).
class MoeFp4Staging {
 public:
  MoeFp4Staging(const MoeFp4Shape& shape, int capacity);

  const MoeFp4Shape& shape() const { return shape_; }
  int capacity() const { return capacity_; }
  // The staged experts: layer experts [begin, begin + count).
  int begin() const { return begin_; }
  int count() const { return count_; }
  size_t matrix_bytes() const { return matrix_bytes_; }  // packed bytes of one expert's matrix
  size_t scale_bytes() const { return scale_bytes_; }    // scale codes of one expert's matrix
  // Staged bytes of one expert (its tensors and its three weight_scale_2).
  static size_t bytes_per_expert(const MoeFp4Shape& shape);
  uint8_t* packed(int matrix) const { return buffer_.get() + size_t(matrix) * capacity_ * matrix_bytes_; }
  uint8_t* scales(int matrix) const {
    return buffer_.get() + 3 * size_t(capacity_) * matrix_bytes_ + size_t(matrix) * capacity_ * scale_bytes_;
  }
  float* scale_2() const {
    return reinterpret_cast<float*>(buffer_.get() + 3 * size_t(capacity_) * (matrix_bytes_ + scale_bytes_));
  }

  // Copies experts[begin, begin + count) (count ≤ capacity) as they are, one copy per tensor, in
  // order on `stream` (so a previous chunk's repack is done with the buffer before it is overwritten).
  void upload(const std::vector<MoeFp4ExpertTensors>& experts, int begin, int count, cudaStream_t stream);
  // Marks experts [begin, begin + count) as staged whose bytes were written on the device (benchmarks).
  void set_staged(int begin, int count);

 private:
  MoeFp4Shape shape_;
  int capacity_ = 0, begin_ = 0, count_ = 0;
  size_t matrix_bytes_ = 0, scale_bytes_ = 0;
  DeviceBuffer<uint8_t> buffer_;
};

// What the kernels found, accumulated over the chunks of a layer: the first invalid scale (the one a
// sequential moe_fp4_repack reports: lowest expert, then w1, w3, w2, then index) and the W4A8 groups
// that are not exact in e4m3 (MoeFp4Repacked::w4a8_rounded_groups).
class MoeFp4RepackStatus {
 public:
  MoeFp4RepackStatus();
  void reset(cudaStream_t stream);
  unsigned long long* device() const { return words_.get(); }
  // Waits for the stream, then fails with moe_fp4_repack's message if a scale was invalid
  // (`experts` gives the weight_scale_2 values the message quotes); returns the rounded groups.
  size_t check(const std::vector<MoeFp4ExpertTensors>& experts, cudaStream_t stream) const;

 private:
  DeviceBuffer<unsigned long long> words_;  // [0] first error key (all ones: none), [1] rounded groups
};

// Enqueues the repack of the staged experts into the same experts of `out` (allocated for the
// staging's shape). No host synchronisation; capturable into a CUDA graph.
void moe_fp4_repack_enqueue(const MoeFp4Staging& staged, MoeFp4Weights& out, MoeFp4RepackStatus& status,
                            cudaStream_t stream);

// The whole layer: validates the shape as moe_fp4_repack does, stages the experts in chunks of at most
// `max_staging_bytes` (at least one expert), repacks each into `out` (MoeFp4Weights::allocate(shape)),
// waits once and fails as moe_fp4_repack would on an invalid scale. The staging is freed on return.
// Returns the W4A8 groups not exact in e4m3.
constexpr size_t kMoeRepackStagingBytes = size_t(1) << 30;
size_t moe_fp4_repack_device(const std::vector<MoeFp4ExpertTensors>& experts, MoeFp4Weights& out,
                             cudaStream_t stream, size_t max_staging_bytes = kMoeRepackStagingBytes);

// The repack kernels' launches (the sm_120 resource test): 256 threads, no dynamic shared memory.
std::vector<KernelLaunch> moe_fp4_repack_kernel_launches();

}  // namespace dsv4::cuda
