// linear_fp8w on the tensor cores (linear.h): an FP8_BLOCK weight run on its exact bf16 values
// against bf16 activations, for row counts past a decode step's, where the CUDA-core kernel's
// multiply-adds outgrow its weight bytes and cuBLASLt would need the weight's bf16 copy (twice the
// bytes, or a conversion per call). Two users: wo_a (bf16 activations, as the reference), and the
// FP8 block linears, fed their quantised activations' exact bf16 values (the products the
// reference's FP8 GEMM makes: x's power-of-two scale rides in the bf16 values).
//
// Tiles through shared memory: a block takes 128 weight columns (one scale row) × 64 activation rows
// and walks its run of K in 64-channel stages, 4 in flight through cp.async (the weight stages ask for
// HBM before the programmatic-launch wait: they do not depend on the kernel ahead). 8 warps, each 32
// columns × 32 rows: 2 × 4 mma.sync m16n8k16 (bf16, f32 accumulators) per 16 channels. The weight is
// the MMA's M side. Its codes are converted in registers (e4m3 → f16 → f32 → bf16, exact) from 4-byte
// shared loads; the activations' B fragments are 8-byte shared loads. Both use one map of the MMA's k
// positions onto the 16 channels (lane t holds channels 4t … 4t + 3: k pairs {2t, 2t+1} and
// {2t+8, 2t+9}), which a dot product allows, so no ldmatrix and no transposition. Row strides of 80
// and 160 bytes keep those loads free of bank conflicts.
//
// Numerics: the reference's bf16 products, exact in f32; per 128-channel scale block the tensor core
// sums them (f32, its order), the block's sum is scaled by its power of two and added in f32 (as the
// FP8 kernels promote). Runs of K over `splits` blocks (from N and K only, so a row's bits never
// depend on the batch) write f32 partials that a second launch adds in run order. A row's arithmetic
// does not depend on the rows beside it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <climits>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/ptx_primitives.cuh"
#include "backend/cuda/quant_math.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBN = 128, kBM = 64, kBK = 64, kStages = 4;
constexpr int kWStride = kBK + 16;      // bytes a weight row takes in shared memory
constexpr int kXStride = 2 * kBK + 32;  // bytes an activation row takes
constexpr int kWStage = kBN * kWStride, kXStage = kBM * kXStride;
constexpr int kSmem = kStages * (kWStage + kXStage);  // 80 KB: within sm_120's 99 KB a block
constexpr int kTargetBlocks = 264;                    // two per SM on 132 SMs

// Two e4m3 codes (the low 16 bits) → a bf16x2 register, exactly; the lower code in the low half.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(codes & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}

__global__ void __launch_bounds__(kThreads, 2)
    linear_fp8w_mma_kernel(const uint16_t* __restrict__ x, int rows, int K, int64_t x_row_stride, int cols_per_group,
                           const uint8_t* __restrict__ w, const uint8_t* __restrict__ w_scale, int N, int splits,
                           void* __restrict__ y, bool y_f32, float* __restrict__ partials) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
  const int wn = warp % 4, wm = warp / 4;  // the warp's 32 columns and 32 rows of the tile
  const int n0 = int(blockIdx.x) * kBN, r0 = int(blockIdx.y) * kBM, split = int(blockIdx.z);
  const int kblocks = K / 128;
  const int kb_begin = split * kblocks / splits, kb_end = (split + 1) * kblocks / splits;
  const int steps = 2 * (kb_end - kb_begin);
  const int64_t x_col0 = int64_t(n0 / cols_per_group) * K;  // (a tile lies in one group)
  const uint32_t s_w = smem_u32(smem), s_x = s_w + kStages * kWStage;
  const uint8_t* scale_row = w_scale + int64_t(n0 / 128) * kblocks;

  // A stage: the weight's 128 rows × 64 bytes and the activations' 64 rows × 128 bytes, 512 pieces of
  // 16 bytes each, two per thread; rows past N or `rows` are zero-filled.
  const auto load_w = [&](int step) {
    const int k = (2 * kb_begin + step) * kBK;
    const uint32_t dst = s_w + (step % kStages) * kWStage;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int p = tid + i * kThreads, row = p / 4, piece = p % 4, n = n0 + row;
      cp_async16(dst + row * kWStride + piece * 16, w + int64_t(n < N ? n : 0) * K + k + piece * 16, n < N ? 16 : 0);
    }
  };
  const auto load_x = [&](int step) {
    const int k = (2 * kb_begin + step) * kBK;
    const uint32_t dst = s_x + (step % kStages) * kXStage;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int p = tid + i * kThreads, row = p / 8, piece = p % 8, r = r0 + row;
      cp_async16(dst + row * kXStride + piece * 16, x + int64_t(r < rows ? r : 0) * x_row_stride + x_col0 + k + piece * 8,
                 r < rows ? 16 : 0);
    }
  };
  // The first stages' weights go before the wait; group s then holds stage s's activations (group 0
  // also the early weights), so waiting for group s finds stage s whole.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < steps) load_w(s);
  pdl_wait();
  pdl_launch_dependents();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) load_x(s);
    cp_async_commit();
  }

  float total[2][4][4] = {}, part[2][4][4] = {};
  for (int step = 0; step < steps; ++step) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage `step` landed for every thread; stage step − 1 is free to refill
    const int next = step + kStages - 1;
    if (next < steps) {
      load_w(next);
      load_x(next);
    }
    cp_async_commit();
    const uint32_t wa = s_w + (step % kStages) * kWStage, xa = s_x + (step % kStages) * kXStage;
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const uint32_t at = wa + (wn * 32 + mt * 16 + g) * kWStride + ks * 16 + 4 * t;
        const uint32_t lo = ld_shared_u32(at), hi = ld_shared_u32(at + 8 * kWStride);
        a[mt][0] = e4m3x2_to_bf16x2(lo);
        a[mt][1] = e4m3x2_to_bf16x2(hi);
        a[mt][2] = e4m3x2_to_bf16x2(lo >> 16);
        a[mt][3] = e4m3x2_to_bf16x2(hi >> 16);
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const uint2 b = ld_shared_v2(xa + (wm * 32 + nt * 8 + g) * kXStride + (ks * 16 + 4 * t) * 2);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) mma_bf16(part[mt][nt], a[mt], b.x, b.y);
      }
    }
    if (step % 2 == 1) {  // a 128-channel block done: its power-of-two scale, then the f32 total
      const float sw = e8m0_to_f32_dev(__ldg(scale_row + kb_begin + step / 2));
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            total[mt][nt][i] += part[mt][nt][i] * sw;
            part[mt][nt][i] = 0.f;
          }
    }
  }
  cp_async_wait_all();

  // Accumulator i of (mt, nt): column n0 + wn·32 + mt·16 + g (+8 for i ≥ 2), row r0 + wm·32 + nt·8
  // + 2t (+1 for odd i).
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int n = n0 + wn * 32 + mt * 16 + g + (i >= 2 ? 8 : 0), r = r0 + wm * 32 + nt * 8 + 2 * t + (i & 1);
        if (n >= N || r >= rows) continue;
        const int64_t at = int64_t(r) * N + n;
        if (splits > 1) partials[int64_t(split) * rows * N + at] = total[mt][nt][i];
        else if (y_f32) static_cast<float*>(y)[at] = total[mt][nt][i];
        else static_cast<uint16_t*>(y)[at] = bf16_bits(total[mt][nt][i]);
      }
}

// y = Σ over the runs, in run order, of their f32 partials (rounded to bf16 unless y_f32).
__global__ void __launch_bounds__(256) linear_fp8w_sum_kernel(const float* __restrict__ partials, int64_t count,
                                                              int splits, void* __restrict__ y, bool y_f32) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  float sum = partials[i];
  for (int s = 1; s < splits; ++s) sum += partials[int64_t(s) * count + i];
  if (y_f32) static_cast<float*>(y)[i] = sum;
  else static_cast<uint16_t*>(y)[i] = bf16_bits(sum);
}

// Runs of K (a power of two ≤ the 128-channel blocks, at most 8) so that the column tiles fill the
// GPU: from N and K only.
int k_runs(int N, int K) {
  const int tiles = (N + kBN - 1) / kBN, blocks = K / 128;
  int s = 1;
  while (s < 8 && tiles * s < kTargetBlocks && blocks >= 2 * s) s *= 2;
  return s;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

bool linear_fp8w_mma_available(int64_t rows, int K, int64_t x_row_stride, int groups, int N, const void* x,
                               const uint8_t* w) {
  return rows > 0 && rows <= INT_MAX / 2 && K > 0 && K % 128 == 0 && groups > 0 && N > 0 && N % groups == 0 &&
         (N / groups) % kBN == 0 && x_row_stride % 8 == 0 && x_row_stride >= int64_t(groups) * K && aligned16(x) &&
         aligned16(w) && (rows + kBM - 1) / kBM <= 65535;
}

size_t linear_fp8w_mma_workspace(int64_t rows, int K, int N) {
  const int splits = k_runs(N, K);
  return splits > 1 ? size_t(splits) * size_t(rows) * size_t(N) * sizeof(float) : 0;
}

void linear_fp8w_mma(const uint16_t* x, int64_t rows, int K, int64_t x_row_stride, int groups, const uint8_t* w,
                     const uint8_t* w_scale, int N, void* y, float* workspace, cudaStream_t stream, bool y_f32) {
  if (!linear_fp8w_mma_available(rows, K, x_row_stride, groups, N, x, w) || !w_scale)
    fail("linear_fp8w_mma: {} rows, K {}, N {}, {} groups, row stride {}: K and each group's columns must be multiples "
         "of 128, the row stride of 8, x and w 16-byte aligned",
         rows, K, N, groups, x_row_stride);
  const int splits = k_runs(N, K);
  if (splits > 1 && !workspace) fail("linear_fp8w_mma: {} runs of K need the workspace", splits);
  allow_dynamic_smem(linear_fp8w_mma_kernel, kSmem);
  const dim3 grid(unsigned(N / kBN), unsigned((rows + kBM - 1) / kBM), unsigned(splits));
  launch_programmatic(linear_fp8w_mma_kernel, grid, dim3(kThreads), size_t(kSmem), stream, x, int(rows), K, x_row_stride,
                      N / groups, w, w_scale, N, splits, y, y_f32, workspace);
  DSV4_CUDA_CHECK_LAUNCH();
  if (splits == 1) return;
  const int64_t count = rows * N;
  launch_programmatic(linear_fp8w_sum_kernel, dim3(unsigned((count + 255) / 256)), dim3(256), 0, stream,
                      static_cast<const float*>(workspace), count, splits, y, y_f32);
  DSV4_CUDA_CHECK_LAUNCH();
}

}  // namespace dsv4::cuda
