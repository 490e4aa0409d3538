// One thread per element; the value is random_fill_reference's: the same integer hash, the same
// exact 24-bit uniform, one rounded product and one rounded sum (no FMA), bf16 by round-to-nearest-
// even as core/dtypes.h's f32_to_bf16.
#include <algorithm>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/random_fill.h"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint16_t bf16_rne(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

__global__ void __launch_bounds__(kThreads) random_fill_kernel(RandomFill f, void* __restrict__ dst, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    if (f.kind == RandomFill::Kind::Constant) {
      static_cast<uint8_t*>(dst)[i] = f.byte;
      continue;
    }
    const uint64_t r = random_fill_number(f, i);
    switch (f.kind) {
      case RandomFill::Kind::Bf16Uniform:
        static_cast<uint16_t*>(dst)[i] = bf16_rne(__fadd_rn(f.mean, __fmul_rn(f.amp, random_unit(r))));
        break;
      case RandomFill::Kind::F32Uniform:
        static_cast<float*>(dst)[i] = __fadd_rn(f.mean, __fmul_rn(f.amp, random_unit(r)));
        break;
      case RandomFill::Kind::Fp8Weight:
        static_cast<uint8_t*>(dst)[i] = uint8_t((r & 0x87) | (((r >> 3) & 3) + 5) << 3);
        break;
      default: static_cast<uint8_t*>(dst)[i] = uint8_t(r); break;
    }
  }
}

}  // namespace

void random_fill(const RandomFill& fill, void* dst, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 1 << 16);
  random_fill_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(fill, dst, n);
  DSV4_CUDA_CHECK_LAUNCH();
}

}  // namespace dsv4::cuda
