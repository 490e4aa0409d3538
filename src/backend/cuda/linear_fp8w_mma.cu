// An FP8_BLOCK weight run on its exact bf16 values against bf16 activations, on the tensor cores
// (linear.h linear_fp8w_mma). Two users: wo_a at every row count below kFp8wGemmMinRows (bf16
// activations, as the reference), and the FP8 block linears at 32–127 rows, fed their quantised
// activations' exact bf16 values (the products the reference's FP8 GEMM makes: x's power-of-two scale
// rides in the bf16 values), where cuBLASLt would need the weight's bf16 copy per call.
//
// Two forms, one arithmetic. The weight is the MMA's M side (16 columns a warp), the activation rows
// its N side (8-row tiles), and both forms use one map of the MMA's k positions onto a 64-channel
// chunk, which a dot product allows: in step s (4 a chunk) lane (g, t) supplies channels
// 16t + 4s … 16t + 4s + 3 (the k pairs {2t, 2t+1} and {2t+8, 2t+9} of m16n8k16). So a lane's 16
// weight bytes of a chunk are one 16-byte load, and its 32 activation bytes two.
// - Up to 8 rows (a decode step): the weight streams straight into registers, as the FP8 decode
//   kernel of linear_fp8_mma.cu does — no shared memory and no barrier a stage. A warp takes 16
//   columns and one run of K, loads the next 128-channel block while the current one multiplies
//   (the first block's weights before the programmatic-launch wait), and the block adds its warps'
//   runs in run order: one launch. On an H100, wo_a's 33.5 MB at 1–8 rows: 13.6–14.2 µs (80–82% of
//   copy) against 18.4–19.3 for the 16-row tile and its sum launch; the batch-1 step 1.8% shorter
//   (docs/perf/2026-12-07-wo-a-register-form.md).
// - From 9 rows, tiles through shared memory: a block takes 128 weight columns (one scale row) ×
//   16 activation rows (up to 16 rows, 7 stages) or 64 (4 stages), and walks its run of K in
//   64-channel stages through cp.async (the weight stages ask for HBM before the wait: they do not
//   depend on the kernel ahead). 8 warps, each 16 columns × the block's rows: one mma.sync per
//   8-row tile that holds a row and 16 channels (tiles past `rows` are neither loaded nor
//   multiplied). Weight rows take 64 bytes in shared memory and activation rows 144: the 16-byte
//   loads of a quarter warp (rows g, g + 1 × t) then meet no bank twice.
// The codes are converted in registers (e4m3 → f16 → f32 → bf16, exact). Measured against earlier
// tiled forms (docs/perf/2026-12-07-wo-a-fp8-tiled.md, wo_a on an H100): warps of 32 columns × 32
// rows, which converted every code twice and ran every tile, ~28 µs at 1–64 rows; a CUDA-core
// kernel (16-byte loads of 16 codes) 22.2 µs at one row.
//
// Numerics: the reference's bf16 products, exact in f32; per 128-channel scale block the tensor core
// sums them (f32, its order: the same 8 MMAs in the same order in both forms), the block's sum is
// scaled by its power of two and added in f32 (fmaf, as the FP8 kernels promote). Runs of K (from
// N and K only) are added in run order: in the block (register form) or by a second launch over f32
// partials (tiled). An output has the same bits in either form and a row's arithmetic does not
// depend on the rows beside it, so a row's bits never depend on the batch.
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
constexpr int kWStride = kBK;           // bytes a weight row takes in shared memory
constexpr int kXStride = 2 * kBK + 16;  // bytes an activation row takes
constexpr int kWStage = kBN * kWStride;
constexpr int kTargetBlocks = 264;  // two per SM on 132 SMs
constexpr int kSmallRows = 16;      // up to here the 16-row tile
constexpr int kRegisterRows = 8;    // up to here the register form

// The block's rows (kBM) and the stages it has: a decode step's few rows leave room for deeper
// stages in the same shared memory (within sm_120's 99 KB a block), so more weight bytes in flight.
// The 16-row tile's 71.75 KB let three blocks share an H100's SM (87.5 KB with 80-byte weight rows
// allowed two): the batch-16 step measured 1% longer, with wo_b, launched early behind wo_a, the
// slower of the two. 8 stages (82 KB, two blocks again) is the candidate, not yet run on a GPU.
template <int kBM>
struct RowTile {
  static constexpr int kStages = kBM <= kSmallRows ? 7 : 4;
  static constexpr int kXStage = kBM * kXStride;
  static constexpr int kSmem = kStages * (kWStage + kXStage);  // 71.75 KB at 16 rows, 68 KB at 64
  static_assert(kSmem <= 99 * 1024, "sm_120: 99 KB of shared memory a block");
};

// Two e4m3 codes (the low 16 bits) → a bf16x2 register, exactly; the lower code in the low half.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(codes & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// The A fragment of MMA step s from a lane's 16 code bytes of rows g (lo) and g + 8 (hi).
__device__ __forceinline__ void weight_fragment(const uint4& lo, const uint4& hi, int s, uint32_t (&a)[4]) {
  const uint32_t l = word(lo, s), h = word(hi, s);
  a[0] = e4m3x2_to_bf16x2(l);
  a[1] = e4m3x2_to_bf16x2(h);
  a[2] = e4m3x2_to_bf16x2(l >> 16);
  a[3] = e4m3x2_to_bf16x2(h >> 16);
}

// MMA step s of a chunk: the lane's 8 activation words (channels 16t … 16t + 15) give words 2s, 2s + 1.
__device__ __forceinline__ void mma_step(float (&d)[4], const uint32_t (&a)[4], const uint4& x0, const uint4& x1, int s) {
  const uint4& x = s < 2 ? x0 : x1;
  mma_bf16(d, a, word(x, 2 * (s % 2)), word(x, 2 * (s % 2) + 1));
}

// Block scaling: the 128-channel block's tensor-core sum times its power of two, added in f32.
__device__ __forceinline__ void add_scaled(float (&total)[4], float (&part)[4], float sw) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    total[i] = __fmaf_rn(part[i], sw, total[i]);
    part[i] = 0.f;
  }
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
    const uint32_t wa = s_w + (step % kStages) * kWStage + (warp * 16 + g) * kWStride + 16 * t;
    const uint32_t xa = s_x + (step % kStages) * kXStage + g * kXStride + 32 * t;
    uint32_t a[4][4];
    {
      const uint4 lo = ld_shared_v4(wa), hi = ld_shared_v4(wa + 8 * kWStride);
#pragma unroll
      for (int s = 0; s < 4; ++s) weight_fragment(lo, hi, s, a[s]);
    }
#pragma unroll
    for (int nt = 0; nt < kBM / 8; ++nt) {
      if (nt >= row_tiles) break;  // the same for the whole block
      const uint4 x0 = ld_shared_v4(xa + nt * 8 * kXStride), x1 = ld_shared_v4(xa + nt * 8 * kXStride + 16);
#pragma unroll
      for (int s = 0; s < 4; ++s) mma_step(part[nt], a[s], x0, x1, s);
    }
    if (step % 2 == 1) {  // a 128-channel block done
      const float sw = e8m0_to_f32_dev(__ldg(scale_row + kb_begin + step / 2));
#pragma unroll
      for (int nt = 0; nt < kBM / 8; ++nt) add_scaled(total[nt], part[nt], sw);
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

// Up to kRegisterRows rows: a block is 8 warps, 8 / splits column tiles × splits runs of K (warp =
// tile · splits + run). Lane (g, t) streams bytes 16t … 16t + 15 of each 64-channel chunk of weight
// rows col0 + g and col0 + g + 8, and the same channels of activation row g (zeros past `rows`).
__global__ void __launch_bounds__(kThreads, 2)
    linear_fp8w_rows_kernel(const uint16_t* __restrict__ x, int rows, int K, int64_t x_row_stride, int cols_per_group,
                            const uint8_t* __restrict__ w, const uint8_t* __restrict__ w_scale, int N, int splits,
                            void* __restrict__ y, bool y_f32) {
  constexpr int kWarps = kThreads / 32;
  __shared__ float run_sum[kWarps][4][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int tile = int(blockIdx.x) * (kWarps / splits) + warp / splits, run = warp % splits;
  const int col0 = tile * 16, kblocks = K / 128;
  const int kb_begin = run * kblocks / splits, kb_end = (run + 1) * kblocks / splits;
  const uint8_t* w_lo = w + int64_t(col0 + g) * K + 16 * t;
  const uint8_t* w_hi = w_lo + int64_t(8) * K;
  const uint8_t* scale_row = w_scale + int64_t(col0 / 128) * kblocks;
  const bool row_ok = g < rows;
  const uint16_t* x_row = x + int64_t(row_ok ? g : 0) * x_row_stride + int64_t(col0 / cols_per_group) * K + 16 * t;

  // Block kb + 1 is loaded while block kb multiplies: [2c] row g / channels 16t … 16t + 7 of chunk c,
  // [2c + 1] row g + 8 / channels 16t + 8 … 16t + 15.
  uint4 next_w[4], next_x[4];
  float next_sw = 0.f;
  const auto load_weights = [&](int kb) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      next_w[2 * c] = __ldg(reinterpret_cast<const uint4*>(w_lo + int64_t(kb) * 128 + 64 * c));
      next_w[2 * c + 1] = __ldg(reinterpret_cast<const uint4*>(w_hi + int64_t(kb) * 128 + 64 * c));
    }
    next_sw = e8m0_to_f32_dev(__ldg(scale_row + kb));
  };
  const auto load_acts = [&](int kb) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      next_x[i] = row_ok ? __ldg(reinterpret_cast<const uint4*>(x_row + int64_t(kb) * 128 + 64 * (i / 2) + 8 * (i % 2)))
                         : make_uint4(0, 0, 0, 0);
  };
  // The first block's weights stream while the kernel ahead finishes.
  if (kb_begin < kb_end) load_weights(kb_begin);
  pdl_wait();
  pdl_launch_dependents();
  if (kb_begin < kb_end) load_acts(kb_begin);
  float total[4] = {};
  for (int kb = kb_begin; kb < kb_end; ++kb) {
    const uint4 cw[4] = {next_w[0], next_w[1], next_w[2], next_w[3]};
    const uint4 cx[4] = {next_x[0], next_x[1], next_x[2], next_x[3]};
    const float sw = next_sw;
    if (kb + 1 < kb_end) {
      load_weights(kb + 1);
      load_acts(kb + 1);
    }
    float part[4] = {};
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint32_t a[4];
        weight_fragment(cw[2 * c], cw[2 * c + 1], s, a);
        mma_step(part, a, cx[2 * c], cx[2 * c + 1], s);
      }
    add_scaled(total, part, sw);
  }
  if (splits > 1) {  // the runs, added in run order (the tiled form's second launch)
#pragma unroll
    for (int i = 0; i < 4; ++i) run_sum[warp][i][lane] = total[i];
    __syncthreads();
    if (run != 0) return;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float sum = run_sum[warp][i][lane];
      for (int s = 1; s < splits; ++s) sum += run_sum[warp + s][i][lane];
      total[i] = sum;
    }
  }
  // Accumulator i: column col0 + g (+8 for i ≥ 2), row 2t (+1 for odd i).
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int n = col0 + g + (i >= 2 ? 8 : 0), r = 2 * t + (i & 1);
    if (r >= rows) continue;
    const int64_t at = int64_t(r) * N + n;
    if (y_f32) static_cast<float*>(y)[at] = total[i];
    else static_cast<uint16_t*>(y)[at] = bf16_bits(total[i]);
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
  const int splits = rows <= kRegisterRows ? 1 : k_runs(N, K);  // (the register form adds its runs in the block)
  return splits > 1 ? size_t(splits) * size_t(rows) * size_t(N) * sizeof(float) : 0;
}

void linear_fp8w_mma(const uint16_t* x, int64_t rows, int K, int64_t x_row_stride, int groups, const uint8_t* w,
                     const uint8_t* w_scale, int N, void* y, float* workspace, cudaStream_t stream, bool y_f32) {
  if (!linear_fp8w_mma_available(rows, K, x_row_stride, groups, N, x, w) || !w_scale)
    fail("linear_fp8w_mma: {} rows, K {}, N {}, {} groups, row stride {}: K and each group's columns must be multiples "
         "of 128, the row stride of 8, x and w 16-byte aligned",
         rows, K, N, groups, x_row_stride);
  const int splits = k_runs(N, K);
  if (rows <= kRegisterRows) {
    launch_programmatic(linear_fp8w_rows_kernel, dim3(unsigned(N / 16 / (kThreads / 32 / splits))), dim3(kThreads), 0,
                        stream, x, int(rows), K, x_row_stride, N / groups, w, w_scale, N, splits, y, y_f32);
    DSV4_CUDA_CHECK_LAUNCH();
    return;
  }
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
