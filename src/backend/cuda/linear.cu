// The bf16-weight linears on CUDA cores (linear.h), and the FP8 → bf16 conversions of the cuBLASLt
// path. Layout: block = 8 warps = 8 output columns × up to 64 rows (grid.y covers the rows); a warp
// streams its column's weight row with 16-byte loads, lanes striding along K, and multiplies each
// loaded chunk into 8 rows' accumulators before the next chunk, so a decode step (≤ 8 rows) reads
// every weight byte once. The activations are re-read per column from L1/L2 (small next to the
// weights). One warp-shuffle sum per output. A narrow linear (the gate, the compressors) would put
// too few warps in flight to keep HBM busy, so `splits` warps share a column, each over a
// contiguous part of K, and their sums add in slice order through shared memory: deterministic, and
// chosen from N and K only, so a row's result never depends on the rows beside it.
//
// Numerics: f32 products and sums (the CPU sums in double and rounds once), y rounded to bf16 once
// (SPEC §2, bf()).
#include "backend/cuda/linear.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <climits>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/quant_math.cuh"
#include "backend/cuda/ptx_primitives.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

constexpr int kColsPerBlock = 8;  // one warp each
constexpr int kRowsPerPass = 8;   // accumulators per lane
constexpr int kRowsPerBlock = 64;
constexpr int kTargetWarps = 4096;  // ~31 per SM on 132 SMs: enough loads in flight for a narrow linear
// 16-byte weight loads a lane has in flight (f32 inputs: 2, or they spill at four blocks per SM)
template <bool kXF32>
constexpr int kAhead = kXF32 ? 2 : 4;

// Warps per output column (a power of two ≤ 8) for N columns of `chunks` 16-byte loads each; a
// slice keeps at least one load per lane.
int k_splits(int N, int chunks) {
  int s = 1;
  while (s < kColsPerBlock && int64_t(N) * s < kTargetWarps && chunks / (2 * s) >= 32) s *= 2;
  return s;
}

// The slices' sums of one pass (lane i < 8 holds row r0 + i's) → the column's sum, added in slice
// order by the column's first warp; every thread of the block calls it (it synchronises).
__device__ __forceinline__ float combine_slices(float (*sum)[kRowsPerPass], int warp, int splits, int lane, float mine) {
  if (lane < kRowsPerPass) sum[warp][lane] = mine;
  __syncthreads();
  float total = 0.f;
  if (warp % splits == 0 && lane < kRowsPerPass)
    for (int s = 0; s < splits; ++s) total += sum[warp + s][lane];
  __syncthreads();
  return total;
}

// 16 e4m3 codes (byte i = element i) → f32, exactly (every e4m3 value is an f16 value).
__device__ __forceinline__ void e4m3x16_to_f32(uint4 v, float (&f)[16]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int w = 0; w < 4; ++w)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __half2_raw raw =
          __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t((words[w] >> (16 * h)) & 0xffffu), __NV_E4M3);
      const float2 pair = __half22float2(__half2(raw));
      f[4 * w + 2 * h] = pair.x;
      f[4 * w + 2 * h + 1] = pair.y;
    }
}

__device__ __forceinline__ uint16_t f32_to_bf16_bits(float v) {
  const __nv_bfloat16 b = __float2bfloat16_rn(v);
  return *reinterpret_cast<const uint16_t*>(&b);
}

// 8 bf16 (16 bytes) → f32 (no local array: the words stay in registers).
__device__ __forceinline__ void bf16x8_to_f32(uint4 v, float (&f)[8]) {
  f[0] = __uint_as_float(v.x << 16), f[1] = __uint_as_float(v.x & 0xffff0000u);
  f[2] = __uint_as_float(v.y << 16), f[3] = __uint_as_float(v.y & 0xffff0000u);
  f[4] = __uint_as_float(v.z << 16), f[5] = __uint_as_float(v.z & 0xffff0000u);
  f[6] = __uint_as_float(v.w << 16), f[7] = __uint_as_float(v.w & 0xffff0000u);
}

// x element k of row r for column group g, as f32.
template <bool kXF32>
__device__ __forceinline__ float load_x(const void* x, int64_t offset) {
  if constexpr (kXF32) return __ldg(static_cast<const float*>(x) + offset);
  else return __uint_as_float(uint32_t(__ldg(static_cast<const unsigned short*>(x) + offset)) << 16);
}

// 8 consecutive x elements from a 16-byte-aligned offset (in elements, a multiple of 8).
template <bool kXF32>
__device__ __forceinline__ void load_x8(const void* x, int64_t offset, float (&f)[8]) {
  if constexpr (kXF32) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(x) + offset);
    const float4 a = __ldg(p), b = __ldg(p + 1);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  } else {
    bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(x) + offset)), f);
  }
}

// The weights of one launch (Bf16wOut's, with their splits): part p takes the column blocks
// first_block[p] … first_block[p + 1] − 1 of grid.x.
struct Bf16wParts {
  const uint16_t* w[kMaxBf16wOuts];
  void* y[kMaxBf16wOuts];
  int N[kMaxBf16wOuts], splits[kMaxBf16wOuts], first_block[kMaxBf16wOuts];
  int count;
};

// (At least 4 blocks per SM: without that bound ptxas spilled the bf16-input variants at 40
// registers; with it they take 48 and none.)
// kParts: 1 (one weight: the selection compiles away, so the single linear pays nothing for it —
// a form that chose on every launch left grouped_out_proj ~2% slower on an H100) or kMaxBf16wOuts.
template <bool kXF32, bool kYF32, bool kVectorized, int kParts = 1>
__global__ void __launch_bounds__(kColsPerBlock * 32, 4)
    linear_bf16w_kernel(const void* __restrict__ x, int64_t rows, int K, int64_t x_row_stride, int cols_per_group,
                        const Bf16wParts parts) {
  __shared__ float slice_sum[kColsPerBlock][kRowsPerPass];
  // This block's part, by selects over constant indices (an indexed parameter array would be
  // copied to local memory first: 120 bytes of stack and a slower start for every block).
  const uint16_t* __restrict__ w = parts.w[0];
  void* __restrict__ y = parts.y[0];
  int N = parts.N[0], splits = parts.splits[0], first = 0;
#pragma unroll
  for (int i = 1; i < kParts; ++i)
    if (i < parts.count && int(blockIdx.x) >= parts.first_block[i])
      w = parts.w[i], y = parts.y[i], N = parts.N[i], splits = parts.splits[i], first = parts.first_block[i];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int j = (int(blockIdx.x) - first) * (kColsPerBlock / splits) + warp / splits, slice = warp % splits;
  const bool active = j < N;
  if (!active && splits == 1) return;  // with slices every warp takes part in the combine
  const uint16_t* w_row = w + int64_t(active ? j : 0) * K;
  const int64_t x_col0 = int64_t((active ? j : 0) / cols_per_group) * K;
  const int chunks = K / 8;  // vectorized: 8 bf16 per load (splits is 1 on the element path)
  const int c_begin = slice * chunks / splits, c_end = active ? (slice + 1) * chunks / splits : c_begin;
  // The weights do not depend on earlier kernels: a lane's first kAhead chunks are asked for before
  // the programmatic-launch wait, so they stream while the kernel before finishes (into L1: loading
  // them into registers here spills at four blocks per SM).
  if constexpr (kVectorized) {
#pragma unroll
    for (int u = 0; u < kAhead<kXF32>; ++u) {
      const int c = c_begin + lane + 32 * u;
      if (c < c_end) prefetch_l1(reinterpret_cast<const uint4*>(w_row) + c);
    }
  }
  pdl_wait();
  pdl_launch_dependents();
  const int64_t row_end = min(rows, int64_t(blockIdx.y + 1) * kRowsPerBlock);
  for (int64_t r0 = int64_t(blockIdx.y) * kRowsPerBlock; r0 < row_end; r0 += kRowsPerPass) {
    float acc[kRowsPerPass] = {};
    if constexpr (kVectorized) {
      // kAhead weight loads of a lane in flight before the first is used: one at a time, a warp
      // waited out a memory round trip per 16 bytes (grouped_out_proj at one row: 16 round trips a
      // warp, two waves of blocks). The products still add in chunk order.
      for (int c0 = c_begin + lane; c0 < c_end; c0 += 32 * kAhead<kXF32>) {
        uint4 wv[kAhead<kXF32>];
#pragma unroll
        for (int u = 0; u < kAhead<kXF32>; ++u) {
          const int c = c0 + 32 * u;
          wv[u] = c < c_end ? __ldg(reinterpret_cast<const uint4*>(w_row) + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kAhead<kXF32>; ++u) {
          const int c = c0 + 32 * u;
          if (c >= c_end) break;
          float wf[8];
          bf16x8_to_f32(wv[u], wf);
#pragma unroll
          for (int i = 0; i < kRowsPerPass; ++i) {
            const int64_t r = r0 + i;
            if (r >= row_end) break;
            float xf[8];
            load_x8<kXF32>(x, r * x_row_stride + x_col0 + int64_t(c) * 8, xf);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[i] = fmaf(xf[e], wf[e], acc[i]);
          }
        }
      }
    } else {
      for (int k = lane; k < K; k += 32) {
        const float wk = __uint_as_float(uint32_t(__ldg(reinterpret_cast<const unsigned short*>(w_row) + k)) << 16);
#pragma unroll
        for (int i = 0; i < kRowsPerPass; ++i) {
          const int64_t r = r0 + i;
          if (r >= row_end) break;
          acc[i] = fmaf(load_x<kXF32>(x, r * x_row_stride + x_col0 + k), wk, acc[i]);
        }
      }
    }
    float mine = 0.f;
#pragma unroll
    for (int i = 0; i < kRowsPerPass; ++i) {
      const float sum = warp_sum(acc[i]);
      mine = lane == i ? sum : mine;
    }
    const float total = splits == 1 ? mine : combine_slices(slice_sum, warp, splits, lane, mine);
    if (slice == 0 && lane < kRowsPerPass && active && r0 + lane < row_end) {
      const int64_t at = (r0 + lane) * N + j;
      if constexpr (kYF32) static_cast<float*>(y)[at] = total;
      else static_cast<uint16_t*>(y)[at] = f32_to_bf16_bits(total);
    }
  }
}

dim3 linear_grid(int64_t rows, int N, int splits) {
  const int cols = kColsPerBlock / splits;
  return dim3(unsigned((N + cols - 1) / cols), unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// One launch over outs[0 … n) (groups > 1: one weight). A weight's splits depend on its N and K
// only, so each output has the bits of its weight launched alone.
template <bool kXF32, bool kYF32>
void launch_bf16w(const void* x, int64_t rows, int K, int64_t x_row_stride, int groups, const Bf16wOut* outs, int n,
                  cudaStream_t stream) {
  bool vectorized = K % 8 == 0 && x_row_stride % 8 == 0 && aligned16(x);
  for (int p = 0; p < n; ++p) vectorized = vectorized && aligned16(outs[p].w);
  Bf16wParts parts{};
  parts.count = n;
  int64_t blocks = 0;
  for (int p = 0; p < n; ++p) {
    parts.w[p] = outs[p].w, parts.y[p] = outs[p].y, parts.N[p] = outs[p].N;
    parts.splits[p] = vectorized ? k_splits(outs[p].N, K / 8) : 1;
    parts.first_block[p] = int(blocks);
    blocks += linear_grid(rows, outs[p].N, parts.splits[p]).x;
  }
  if (blocks > INT_MAX) fail("linear_bf16w: {} column blocks is too many", blocks);
  const dim3 grid(unsigned(blocks), linear_grid(rows, 1, 1).y), block(kColsPerBlock * 32);
  const int cols_per_group = groups == 1 ? INT_MAX : outs[0].N / groups;  // (one group: every column reads x's row)
  if (n > 1 && !vectorized) fail("linear_bf16w: {} weights in one launch need 16-byte loads", n);
  if (n > 1)
    launch_programmatic(linear_bf16w_kernel<kXF32, kYF32, true, kMaxBf16wOuts>, grid, block, 0, stream, x, rows, K,
                        x_row_stride, cols_per_group, parts);
  else if (vectorized)
    launch_programmatic(linear_bf16w_kernel<kXF32, kYF32, true>, grid, block, 0, stream, x, rows, K, x_row_stride,
                        cols_per_group, parts);
  else
    launch_programmatic(linear_bf16w_kernel<kXF32, kYF32, false>, grid, block, 0, stream, x, rows, K, x_row_stride,
                        cols_per_group, parts);
}

// 16 codes per thread → 16 bf16 values: code × scale, exact (see linear.h).
template <bool kWeight>
__global__ void __launch_bounds__(256) fp8_to_bf16_kernel(const uint8_t* __restrict__ codes,
                                                         const void* __restrict__ scales, int64_t rows, int K,
                                                         uint16_t* __restrict__ out) {
  pdl_wait();
  pdl_launch_dependents();
  const int chunks = K / 16, kb = K / 128;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * chunks) return;
  const int64_t r = i / chunks;
  const int b = int(i % chunks) / 8;
  const float s = kWeight ? e8m0_to_f32_dev(static_cast<const uint8_t*>(scales)[(r / 128) * kb + b])
                          : static_cast<const float*>(scales)[r * kb + b];
  float f[16];
  e4m3x16_to_f32(__ldg(reinterpret_cast<const uint4*>(codes) + i), f);
  uint32_t h[8];
#pragma unroll
  for (int j = 0; j < 8; ++j)
    h[j] = uint32_t(f32_to_bf16_bits(f[2 * j] * s)) | uint32_t(f32_to_bf16_bits(f[2 * j + 1] * s)) << 16;
  uint4* o = reinterpret_cast<uint4*>(out) + 2 * i;
  o[0] = make_uint4(h[0], h[1], h[2], h[3]);
  o[1] = make_uint4(h[4], h[5], h[6], h[7]);
}

template <bool kWeight>
void launch_fp8_to_bf16(const uint8_t* codes, const void* scales, int64_t rows, int K, uint16_t* out, cudaStream_t stream) {
  if (rows < 0 || K <= 0 || K % 128) fail("fp8 → bf16: {} rows, K {} (a positive multiple of 128)", rows, K);
  if (!aligned16(codes) || !aligned16(out)) fail("fp8 → bf16: codes and output must be 16-byte aligned");
  const int64_t threads = rows * (K / 16);
  if (!threads) return;
  if ((threads + 255) / 256 > INT_MAX) fail("fp8 → bf16: {} rows of {} is too many", rows, K);
  launch_programmatic(fp8_to_bf16_kernel<kWeight>, dim3(unsigned((threads + 255) / 256)), dim3(256), 0, stream, codes,
                      scales, rows, K, out);
  DSV4_CUDA_CHECK_LAUNCH();
}

}  // namespace

void fp8_weight_to_bf16(const uint8_t* w, const uint8_t* w_scale, int64_t N, int K, uint16_t* out, cudaStream_t stream) {
  launch_fp8_to_bf16<true>(w, w_scale, N, K, out, stream);
}

void fp8_rows_to_bf16(const uint8_t* q, const float* scale, int64_t rows, int K, uint16_t* out, cudaStream_t stream) {
  launch_fp8_to_bf16<false>(q, scale, rows, K, out, stream);
}

namespace {

void launch_bf16w_outs(const void* x, bool x_f32, int64_t rows, int K, int64_t x_row_stride, int groups,
                       const Bf16wOut* outs, int n, bool y_f32, cudaStream_t stream) {
  if (rows == 0) return;
  if ((rows + kRowsPerBlock - 1) / kRowsPerBlock > 65535) fail("linear_bf16w: {} rows is too many", rows);
  if (x_f32) {
    if (y_f32) launch_bf16w<true, true>(x, rows, K, x_row_stride, groups, outs, n, stream);
    else launch_bf16w<true, false>(x, rows, K, x_row_stride, groups, outs, n, stream);
  } else {
    if (y_f32) launch_bf16w<false, true>(x, rows, K, x_row_stride, groups, outs, n, stream);
    else launch_bf16w<false, false>(x, rows, K, x_row_stride, groups, outs, n, stream);
  }
  DSV4_CUDA_CHECK_LAUNCH();
}

}  // namespace

void linear_bf16w(const void* x, bool x_f32, int64_t rows, int K, int64_t x_row_stride, int groups, const uint16_t* w,
                  int N, void* y, bool y_f32, cudaStream_t stream) {
  if (rows < 0 || K <= 0 || N <= 0 || groups <= 0 || N % groups || x_row_stride < int64_t(groups) * K)
    fail("linear_bf16w: {} rows, K {}, N {}, {} groups, row stride {}", rows, K, N, groups, x_row_stride);
  const Bf16wOut out{w, N, y};
  launch_bf16w_outs(x, x_f32, rows, K, x_row_stride, groups, &out, 1, y_f32, stream);
}

void linears_bf16w(const void* x, bool x_f32, int64_t rows, int K, const Bf16wOut* outs, int n_outs, bool y_f32,
                   cudaStream_t stream) {
  if (rows < 0 || K <= 0 || n_outs < 1 || n_outs > kMaxBf16wOuts)
    fail("linears_bf16w: {} rows, K {}, {} weights (1…{})", rows, K, n_outs, kMaxBf16wOuts);
  bool vectorized = K % 8 == 0 && aligned16(x);
  for (int p = 0; p < n_outs; ++p) {
    if (outs[p].N <= 0 || !outs[p].w || !outs[p].y) fail("linears_bf16w: weight {} has N {} or no data", p, outs[p].N);
    vectorized = vectorized && aligned16(outs[p].w);
  }
  if (vectorized || n_outs == 1) {
    launch_bf16w_outs(x, x_f32, rows, K, K, 1, outs, n_outs, y_f32, stream);
    return;
  }
  // A weight alone would take the element loads or the vector loads by its own alignment.
  for (int p = 0; p < n_outs; ++p) launch_bf16w_outs(x, x_f32, rows, K, K, 1, outs + p, 1, y_f32, stream);
}

}  // namespace dsv4::cuda
