// An FP8_BLOCK weight run on its exact bf16 values against bf16 activations, on the tensor cores
// (linear.h linear_fp8w_mma). Two users: wo_a at every row count below kFp8wGemmMinRows (bf16
// activations, as the reference), and the FP8 block linears at 32–127 rows, fed their quantised
// activations' exact bf16 values (the products the reference's FP8 GEMM makes: x's power-of-two scale
// rides in the bf16 values), where cuBLASLt would need the weight's bf16 copy per call.
//
// Tiles through shared memory: a block takes 128 weight columns (one scale row) × 16 activation rows
// (up to 16 rows, 7 stages) or 64 (4 stages), and walks its run of K in 64-channel stages through
// cp.async (the weight stages ask for HBM before the programmatic-launch wait: they do not depend on
// the kernel ahead). 8 warps, each 16 columns × the block's rows: up to 8 mma.sync m16n8k16 (bf16,
// f32 accumulators) per 16 channels, one per 8-row tile that holds a row (tiles past `rows` are
// neither loaded nor multiplied). The weight is the MMA's M side. Its codes are converted in
// registers (e4m3 → f16 → f32 → bf16, exact) from 4-byte shared loads, each by one warp.
// Measured against earlier forms (docs/perf/2026-12-07-wo-a-fp8-tiled.md, wo_a's 33.5 MB on an H100):
// warps of 32 columns × 32 rows, which converted every code twice and ran every tile, took ~28 µs
// at 1–64 rows; this form at 64-row tiles 20 µs at one row, with the 16-row tile's 7 stages 18.3; a
// CUDA-core kernel (16-byte loads of 16 codes) 22.2. The activations' B fragments are 8-byte shared
// loads. Both use one map of the MMA's k positions onto the 16 channels (lane t holds channels
// 4t … 4t + 3: k pairs {2t, 2t+1} and {2t+8, 2t+9}), which a dot product allows, so no ldmatrix and no
// transposition. Row strides of 80 and 160 bytes keep those loads free of bank conflicts.
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
constexpr int kBN = 128, kBK = 64;
constexpr int kWStride = kBK + 16;      // bytes a weight row takes in shared memory
constexpr int kXStride = 2 * kBK + 32;  // bytes an activation row takes
constexpr int kWStage = kBN * kWStride;
constexpr int kTargetBlocks = 264;  // two per SM on 132 SMs
constexpr int kSmallRows = 16;      // up to here the 16-row tile

// The block's rows (kBM) and the stages it has: a decode step's few rows leave room for deeper
// stages in the same shared memory (within sm_120's 99 KB a block), so more weight bytes in flight.
template <int kBM>
struct RowTile {
  static constexpr int kStages = kBM <= kSmallRows ? 7 : 4;
  static constexpr int kXStage = kBM * kXStride;
  static constexpr int kSmem = kStages * (kWStage + kXStage);  // 87.5 KB at 16 rows, 80 KB at 64
  static_assert(kSmem <= 99 * 1024, "sm_120: 99 KB of shared memory a block");
};

// Two e4m3 codes (the low 16 bits) → a bf16x2 register, exactly; the lower code in the low half.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(codes & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}

template <int kBM>
__global__ void __launch_bounds__(kThreads, 2)
    linear_fp8w_mma_kernel(const uint16_t* __restrict__ x, int rows, int K, int64_t x_row_stride, int cols_per_group,
                           const uint8_t* __restrict__ w, const uint8_t* __restrict__ w_scale, int N, int splits,
                           void* __restrict__ y, bool y_f32, float* __restrict__ partials) {
  constexpr int kStages = RowTile<kBM>::kStages, kXStage = RowTile<kBM>::kXStage;
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
  const int n0 = int(blockIdx.x) * kBN, r0 = int(blockIdx.y) * kBM, split = int(blockIdx.z);
  const int row_tiles = min(kBM, rows - r0 + 7) / 8;  // 8-row tiles holding a row of this block
  const int kblocks = K / 128;
  const int kb_begin = split * kblocks / splits, kb_end = (split + 1) * kblocks / splits;
  const int steps = 2 * (kb_end - kb_begin);
  const int64_t x_col0 = int64_t(n0 / cols_per_group) * K;  // (a tile lies in one group)
  const uint32_t s_w = smem_u32(smem), s_x = s_w + kStages * kWStage;
  const uint8_t* scale_row = w_scale + int64_t(n0 / 128) * kblocks;

  // A stage: the weight's 128 rows × 64 bytes (two 16-byte pieces a thread) and the activations'
  // rows of the loaded 8-row tiles × 128 bytes; rows past N or `rows` are zero-filled.
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
    for (int i = 0; i < (kBM * 8 + kThreads - 1) / kThreads; ++i) {
      const int p = tid + i * kThreads, row = p / 8, piece = p % 8, r = r0 + row;
      if (row >= 8 * row_tiles) continue;
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

  float total[kBM / 8][4] = {}, part[kBM / 8][4] = {};
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
      const uint32_t at = wa + (warp * 16 + g) * kWStride + ks * 16 + 4 * t;
      const uint32_t lo = ld_shared_u32(at), hi = ld_shared_u32(at + 8 * kWStride);
      const uint32_t a[4] = {e4m3x2_to_bf16x2(lo), e4m3x2_to_bf16x2(hi), e4m3x2_to_bf16x2(lo >> 16),
                             e4m3x2_to_bf16x2(hi >> 16)};
#pragma unroll
      for (int nt = 0; nt < kBM / 8; ++nt) {
        if (nt >= row_tiles) break;  // the same for the whole block
        const uint2 b = ld_shared_v2(xa + (nt * 8 + g) * kXStride + (ks * 16 + 4 * t) * 2);
        mma_bf16(part[nt], a, b.x, b.y);
      }
    }
    if (step % 2 == 1) {  // a 128-channel block done: its power-of-two scale, then the f32 total
      const float sw = e8m0_to_f32_dev(__ldg(scale_row + kb_begin + step / 2));
#pragma unroll
      for (int nt = 0; nt < kBM / 8; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          total[nt][i] += part[nt][i] * sw;
          part[nt][i] = 0.f;
        }
    }
  }
  cp_async_wait_all();

  // Accumulator i of tile nt: column n0 + warp·16 + g (+8 for i ≥ 2), row r0 + nt·8 + 2t (+1 for odd i).
#pragma unroll
  for (int nt = 0; nt < kBM / 8; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int n = n0 + warp * 16 + g + (i >= 2 ? 8 : 0), r = r0 + nt * 8 + 2 * t + (i & 1);
      if (n >= N || r >= rows) continue;
      const int64_t at = int64_t(r) * N + n;
      if (splits > 1) partials[int64_t(split) * rows * N + at] = total[nt][i];
      else if (y_f32) static_cast<float*>(y)[at] = total[nt][i];
      else static_cast<uint16_t*>(y)[at] = bf16_bits(total[nt][i]);
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
// GPU in one wave: from N and K only.
int k_runs(int N, int K) {
  const int tiles = (N + kBN - 1) / kBN, blocks = K / 128;
  int s = 1;
  while (s < 8 && tiles * 2 * s <= kTargetBlocks && blocks >= 2 * s) s *= 2;
  return s;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

bool linear_fp8w_mma_available(int64_t rows, int K, int64_t x_row_stride, int groups, int N, const void* x,
                               const uint8_t* w) {
  return rows > 0 && rows <= INT_MAX / 2 && K > 0 && K % 128 == 0 && groups > 0 && N > 0 && N % groups == 0 &&
         (N / groups) % kBN == 0 && x_row_stride % 8 == 0 && x_row_stride >= int64_t(groups) * K && aligned16(x) &&
         aligned16(w) && (rows + kSmallRows - 1) / kSmallRows <= 65535;
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
  const auto launch = [&](auto kernel, int row_tile, int smem) {
    allow_dynamic_smem(kernel, smem);
    const dim3 grid(unsigned(N / kBN), unsigned((rows + row_tile - 1) / row_tile), unsigned(splits));
    launch_programmatic(kernel, grid, dim3(kThreads), size_t(smem), stream, x, int(rows), K, x_row_stride, N / groups, w,
                        w_scale, N, splits, y, y_f32, workspace);
  };
  if (rows <= kSmallRows)
    launch(linear_fp8w_mma_kernel<kSmallRows>, kSmallRows, RowTile<kSmallRows>::kSmem);
  else
    launch(linear_fp8w_mma_kernel<64>, 64, RowTile<64>::kSmem);
  DSV4_CUDA_CHECK_LAUNCH();
  if (splits == 1) return;
  const int64_t count = rows * N;
  launch_programmatic(linear_fp8w_sum_kernel, dim3(unsigned((count + 255) / 256)), dim3(256), 0, stream,
                      static_cast<const float*>(workspace), count, splits, y, y_f32);
  DSV4_CUDA_CHECK_LAUNCH();
}

}  // namespace dsv4::cuda
