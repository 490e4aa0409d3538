// One warp per (row, 128-channel block): each lane quantises 4 channels after a warp-wide amax.
// The scales go out row-major [rows, cols/128] (the kernels' and the CPU's layout) or, for the
// cuBLASLt GEMM (linear_gemm.h), transposed and padded.
#include "backend/cuda/act_quant_fp8.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/ptx_primitives.cuh"
#include "backend/cuda/quant_math.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// kMnMajor: scales[b · padded_rows + r] (cuBLASLt's VEC128 layout for a GEMM's B operand) instead of
// row-major, and the blocks of rows ≥ rows (padding up to padded_rows) written as zero codes and scales.
template <bool kMnMajor>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    act_quant_fp8_kernel(const uint16_t* __restrict__ x, size_t blocks, size_t real_blocks, int row_blocks,
                         int padded_rows, uint8_t* __restrict__ q, float* __restrict__ scales) {
  pdl_wait();
  pdl_launch_dependents();
  const size_t block = size_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (block >= blocks) return;
  // Row-major [rows, cols] with cols a multiple of 128: block b covers elements 128·b … 128·b + 127.
  const size_t scale_at =
      kMnMajor ? size_t(block % row_blocks) * size_t(padded_rows) + block / row_blocks : block;
  if (kMnMajor && block >= real_blocks) {
    *reinterpret_cast<uint32_t*>(q + block * 128 + lane * 4) = 0;
    if (lane == 0) scales[scale_at] = 0.f;
    return;
  }
  const uint2 raw = *reinterpret_cast<const uint2*>(x + block * 128 + lane * 4);
  const float v[4] = {__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xffff0000u),
                      __uint_as_float(raw.y << 16), __uint_as_float(raw.y & 0xffff0000u)};
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
  for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = pow2_ceil_dev(fmaxf(amax, 1e-4f) * (1.0f / 448.0f));
  const uint32_t packed = uint32_t(to_e4m3(v[0] / s)) | uint32_t(to_e4m3(v[1] / s)) << 8 |
                          uint32_t(to_e4m3(v[2] / s)) << 16 | uint32_t(to_e4m3(v[3] / s)) << 24;
  *reinterpret_cast<uint32_t*>(q + block * 128 + lane * 4) = packed;
  if (lane == 0) scales[scale_at] = s;
}

}  // namespace

void act_quant_fp8(const uint16_t* x, int rows, int cols, uint8_t* q, float* scales, cudaStream_t stream) {
  if (rows < 0 || cols <= 0 || cols % 128) fail("act_quant_fp8: {} × {} (columns must be a positive multiple of 128)", rows, cols);
  const size_t blocks = size_t(rows) * (cols / 128);
  if (blocks == 0) return;
  launch_programmatic(act_quant_fp8_kernel<false>, dim3(unsigned((blocks + kWarpsPerBlock - 1) / kWarpsPerBlock)),
                      dim3(kWarpsPerBlock * 32), 0, stream, x, blocks, blocks, cols / 128, rows, q, scales);
}

void act_quant_fp8_mn_major(const uint16_t* x, int rows, int padded_rows, int cols, uint8_t* q, float* scales,
                            cudaStream_t stream) {
  if (rows < 0 || padded_rows < rows || cols <= 0 || cols % 128)
    fail("act_quant_fp8_mn_major: {} rows padded to {}, {} columns (a positive multiple of 128)", rows, padded_rows,
         cols);
  const size_t blocks = size_t(padded_rows) * (cols / 128);
  if (blocks == 0) return;
  launch_programmatic(act_quant_fp8_kernel<true>, dim3(unsigned((blocks + kWarpsPerBlock - 1) / kWarpsPerBlock)),
                      dim3(kWarpsPerBlock * 32), 0, stream, x, blocks, size_t(rows) * (cols / 128), cols / 128,
                      padded_rows, q, scales);
}

}  // namespace dsv4::cuda
