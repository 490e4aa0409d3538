// One warp per (row, 128-channel block): each lane quantises 4 channels after a warp-wide amax. The
// values may be the SwiGLU of two inputs (the shared expert's hidden, never written in bf16), and the
// quantised values may also go out as bf16 (the routed experts' input on the FP8 grid).
// The scales go out row-major [rows, cols/128] (the kernels' and the CPU's layout) or, for the
// cuBLASLt GEMM (linear_gemm.h), transposed and padded.
#include "backend/cuda/act_quant_fp8.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/ptx_primitives.cuh"
#include "backend/cuda/quant_math.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// What a warp quantises: x's 4 values of the lane, or (up non-null) the SwiGLU of gate = x and up,
// rounded to bf16 as swiglu_kernel (row_ops.cu) rounds them.
struct QuantSource {
  const uint16_t* x;
  const uint16_t* up;
  float limit;
};

__device__ __forceinline__ void source_values(const QuantSource& src, size_t at, float (&v)[4]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(src.x + at);
  v[0] = __uint_as_float(raw.x << 16), v[1] = __uint_as_float(raw.x & 0xffff0000u);
  v[2] = __uint_as_float(raw.y << 16), v[3] = __uint_as_float(raw.y & 0xffff0000u);
  if (src.up) {
    const uint2 u = *reinterpret_cast<const uint2*>(src.up + at);
    const float up[4] = {__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                         __uint_as_float(u.y & 0xffff0000u)};
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = bf16_value(bf16_bits(swiglu_value(v[i], up[i], src.limit)));
  }
}

// kMnMajor: scales[b · padded_rows + r] (cuBLASLt's VEC128 layout for a GEMM's B operand) instead of
// row-major, and the blocks of rows ≥ rows (padding up to padded_rows) written as zero codes and scales.
// values (may be null): the quantised values as bf16, code · s (exact), fp8_simulate_activations' bits.
template <bool kMnMajor>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    act_quant_fp8_kernel(const QuantSource src, size_t blocks, size_t real_blocks, int row_blocks, int padded_rows,
                         uint8_t* __restrict__ q, float* __restrict__ scales, uint16_t* __restrict__ values) {
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
  float v[4];
  source_values(src, block * 128 + lane * 4, v);
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
  for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = act_fp8_scale(amax);
  const uint32_t packed = uint32_t(to_e4m3(v[0] / s)) | uint32_t(to_e4m3(v[1] / s)) << 8 |
                          uint32_t(to_e4m3(v[2] / s)) << 16 | uint32_t(to_e4m3(v[3] / s)) << 24;
  *reinterpret_cast<uint32_t*>(q + block * 128 + lane * 4) = packed;
  if (lane == 0) scales[scale_at] = s;
  if (values) {
    uint16_t h[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = act_fp8_value(packed >> (8 * i), s);
    *reinterpret_cast<uint2*>(values + block * 128 + lane * 4) =
        make_uint2(uint32_t(h[0]) | uint32_t(h[1]) << 16, uint32_t(h[2]) | uint32_t(h[3]) << 16);
  }
}

}  // namespace

namespace {
void launch_row_major(const QuantSource& src, int rows, int cols, uint8_t* q, float* scales, uint16_t* values,
                      cudaStream_t stream) {
  if (rows < 0 || cols <= 0 || cols % 128) fail("act_quant_fp8: {} × {} (columns must be a positive multiple of 128)", rows, cols);
  const size_t blocks = size_t(rows) * (cols / 128);
  if (blocks == 0) return;
  launch_programmatic(act_quant_fp8_kernel<false>, dim3(unsigned((blocks + kWarpsPerBlock - 1) / kWarpsPerBlock)),
                      dim3(kWarpsPerBlock * 32), 0, stream, src, blocks, blocks, cols / 128, rows, q, scales, values);
}
}  // namespace

void act_quant_fp8(const uint16_t* x, int rows, int cols, uint8_t* q, float* scales, cudaStream_t stream) {
  launch_row_major({x, nullptr, 0.f}, rows, cols, q, scales, nullptr, stream);
}

void act_quant_fp8(const uint16_t* x, int rows, int cols, uint8_t* q, float* scales, uint16_t* values,
                   cudaStream_t stream) {
  launch_row_major({x, nullptr, 0.f}, rows, cols, q, scales, values, stream);
}

void swiglu_act_quant_fp8(const uint16_t* gate, const uint16_t* up, int rows, int cols, float limit, uint8_t* q,
                          float* scales, cudaStream_t stream) {
  if (!up) fail("swiglu_act_quant_fp8: no up projection");
  launch_row_major({gate, up, limit}, rows, cols, q, scales, nullptr, stream);
}

void act_quant_fp8_mn_major(const uint16_t* x, int rows, int padded_rows, int cols, uint8_t* q, float* scales,
                            cudaStream_t stream) {
  if (rows < 0 || padded_rows < rows || cols <= 0 || cols % 128)
    fail("act_quant_fp8_mn_major: {} rows padded to {}, {} columns (a positive multiple of 128)", rows, padded_rows,
         cols);
  const size_t blocks = size_t(padded_rows) * (cols / 128);
  if (blocks == 0) return;
  launch_programmatic(act_quant_fp8_kernel<true>, dim3(unsigned((blocks + kWarpsPerBlock - 1) / kWarpsPerBlock)),
                      dim3(kWarpsPerBlock * 32), 0, stream, QuantSource{x, nullptr, 0.f}, blocks,
                      size_t(rows) * (cols / 128), cols / 128, padded_rows, q, scales, static_cast<uint16_t*>(nullptr));
}

}  // namespace dsv4::cuda
