// The FP8 block linear (linear.h linear_fp8_block) on the tensor cores, shaped for decode and short
// prefill: the weight is the MMA's M side (16 output columns per warp), the activation rows its N
// side (tiles of 8 rows, up to 4 tiles = 32 rows per block row; the row blocks of one column group run
// side by side, so at 64 rows the second reads the weight from L2): every weight byte is read from HBM
// once, straight into registers.
//
// Numerics: the reference's structure, exactly. Every e4m3 code is an f16 value, so both operands
// enter mma.sync m16n8k16 (f16, f32 accumulators) as unscaled codes and their products are exact;
// the accumulators restart at every 128-channel block, whose partial is then scaled by sx·sw (powers
// of two) and added in f32 — DeepSeek-V3's "promotion to f32 every 128 products". Inside a block the
// tensor core sums 16 products per step in its own order (f32 accumulate); the test bound of
// tests/ops/linear_gpu_test.cu holds it to the CUDA-core kernel's f32 error.
//
// Fragments without shared memory. A dot product does not care which k meets which MMA position, as
// long as both operands use the same map. Lane (g = lane / 4, t = lane % 4) loads 16 consecutive
// bytes (16t … 16t + 15 of a 64-channel chunk) of weight rows g and g + 8 and of activation row g of
// each tile; in MMA step s (4 per chunk) its 32-bit word s supplies the logical k pairs {2t, 2t+1}
// (low half) and {2t+8, 2t+9} (high half) of both A (rows g, g + 8) and B (column g) — the register
// layout m16n8k16 asks for. So the weight streams with 16-byte loads and is converted e4m3 → f16 in
// registers (cvt.rn.f16x2.e4m3x2, exact).
//
// Work split. A block is 8 warps: 8 / splits column tiles × splits contiguous runs of K blocks; the
// runs' f32 sums are added in run order through shared memory (deterministic). splits depends on N
// and K only, and a row's arithmetic does not depend on the rows beside it: batch-invariant. One
// launch may carry up to three weights of the same input (Backend::linears), each over its own
// column groups with its own splits: each output has the bits of its weight launched alone.
//
// Measured (docs/perf/2026-12-01-fp8-linear-plan-ahead.md): 45–53% of the copy bandwidth for wq_b and
// wo_b at 1–16 rows (a fixed ~5 µs of the call is the quantisation launch and ramp), then limited by
// latency at 4 tiles (one block per SM): cuBLASLt wins from 64 rows. Feeding the activations as f16
// codes (no conversion per column tile) was slower at every row count: the conversion is not the
// limiter; nor is the weights' depth in flight (two blocks a warp changed nothing). At 16 rows wq_b
// and wo_b take 17–18 µs alone with L2 traffic ~3× their DRAM bytes — each warp re-reads its K range
// of the activation rows (docs/perf/2026-12-03-step-fusions.md): staging them once per block is next.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <climits>

#include "backend/cuda/act_quant_fp8.h"
#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/ptx_primitives.cuh"
#include "backend/cuda/quant_math.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxTiles = 4;  // 8-row tiles per block row (8 spill on sm_120)
constexpr int kBlockRows = 8 * kMaxTiles;
constexpr int kTargetWarps = 2048;  // ~16 per SM on 132 SMs

// Two e4m3 codes (the low 16 bits) → an f16x2 register, exactly; the lower code in the low half.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(codes & 0xffffu), __NV_E4M3);
  return uint32_t(h.x) | uint32_t(h.y) << 16;
}

// The A fragment of one MMA step from the two rows' 32-bit words l (row g) and h (row g + 8).
__device__ __forceinline__ void weight_fragment(uint32_t l, uint32_t h, uint32_t (&a)[4]) {
  a[0] = e4m3x2_to_f16x2(l);
  a[1] = e4m3x2_to_f16x2(h);
  a[2] = e4m3x2_to_f16x2(l >> 16);
  a[3] = e4m3x2_to_f16x2(h >> 16);
}

__device__ __forceinline__ void load_block(const uint8_t* row, bool ok, int kb, uint4 (&v)[2]) {
  if (ok) {
    v[0] = __ldg(reinterpret_cast<const uint4*>(row + int64_t(kb) * 128));
    v[1] = __ldg(reinterpret_cast<const uint4*>(row + int64_t(kb) * 128 + 64));
  } else {
    v[0] = v[1] = make_uint4(0, 0, 0, 0);
  }
}

// The weights of one launch: part i owns the column groups (grid.y) from group0[i] on.
struct Parts {
  const uint8_t* w[kMaxFp8LinearOuts];
  const uint8_t* w_scale[kMaxFp8LinearOuts];
  void* y[kMaxFp8LinearOuts];
  int N[kMaxFp8LinearOuts], splits[kMaxFp8LinearOuts], group0[kMaxFp8LinearOuts];
  int count;
};

template <int kTiles>
__global__ void __launch_bounds__(kWarps * 32, kTiles >= 4 ? 1 : 2)
    linear_fp8_mma_kernel(const uint8_t* __restrict__ act_q, const float* __restrict__ act_scale, int64_t rows, int K,
                          const Parts parts, bool out_f32) {
  __shared__ float run_sum[kWarps][kTiles * 4][32];
  // The block's part, by constant indices (a dynamic index into the parameters would copy them to
  // local memory).
  int p = 0;
#pragma unroll
  for (int i = 1; i < kMaxFp8LinearOuts; ++i)
    if (i < parts.count && int(blockIdx.y) >= parts.group0[i]) p = i;
  const uint8_t* __restrict__ w = parts.w[0];
  const uint8_t* __restrict__ w_scale = parts.w_scale[0];
  void* y_any = parts.y[0];
  int N = parts.N[0], splits = parts.splits[0], group = int(blockIdx.y);
#pragma unroll
  for (int i = 1; i < kMaxFp8LinearOuts; ++i)
    if (p == i) w = parts.w[i], w_scale = parts.w_scale[i], y_any = parts.y[i], N = parts.N[i], splits = parts.splits[i],
                group = int(blockIdx.y) - parts.group0[i];
  uint16_t* __restrict__ y = out_f32 ? nullptr : static_cast<uint16_t*>(y_any);
  float* __restrict__ y_f32 = out_f32 ? static_cast<float*>(y_any) : nullptr;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int tile = group * (kWarps / splits) + warp / splits, run = warp % splits;
  const int col0 = tile * 16, kbs = K / 128;
  const int kb_begin = run * kbs / splits, kb_end = (run + 1) * kbs / splits;
  const bool lo_ok = col0 + g < N, hi_ok = col0 + g + 8 < N;
  const uint8_t* w_lo = w + int64_t(lo_ok ? col0 + g : 0) * K + 16 * t;
  const uint8_t* w_hi = w + int64_t(hi_ok ? col0 + g + 8 : 0) * K + 16 * t;
  const uint8_t* w_run_scale = w_scale + int64_t(min(col0, N - 1) / 128) * kbs;
  // From 9 rows the warp asks L2 for its weight lines before the wait (they stream while the previous
  // kernel finishes). At 1–8 rows that measured 1–3% slower, alone and in the decode step
  // (docs/perf/2026-12-05-one-launch.md): one tile's warps load their first block at once anyway.
  if (kTiles > 1 && t == 0)
    for (int kb = kb_begin; kb < kb_end; ++kb) {
      if (lo_ok) prefetch_l2(w_lo + int64_t(kb) * 128);
      if (hi_ok) prefetch_l2(w_hi + int64_t(kb) * 128);
    }
  const int64_t row0 = int64_t(blockIdx.x) * kBlockRows;
  float total[kTiles][4] = {};
  // Block kb + 1 — weights, activation codes and scales — is loaded while block kb multiplies: the
  // activations come from L2 (another kernel wrote them), and a load in the multiply's dependency
  // chain cost a round trip per block.
  uint4 next_lo[2], next_hi[2], next_x[kTiles][2];
  float next_sa[kTiles], next_sb[kTiles], next_sw = 0;
  const auto load_weights = [&](int kb) {
    load_block(w_lo, lo_ok, kb, next_lo);
    load_block(w_hi, hi_ok, kb, next_hi);
    next_sw = e8m0_to_f32_dev(w_run_scale[kb]);
  };
  const auto load_acts = [&](int kb) {
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const int64_t r = row0 + 8 * j + g, ra = row0 + 8 * j + 2 * t;
      load_block(act_q + (r < rows ? r : 0) * K + 16 * t, r < rows, kb, next_x[j]);
      next_sa[j] = ra < rows ? act_scale[ra * kbs + kb] : 0.f;
      next_sb[j] = ra + 1 < rows ? act_scale[(ra + 1) * kbs + kb] : 0.f;
    }
  };
  const auto load_step = [&](int kb) {
    load_weights(kb);
    load_acts(kb);
  };
  // The first step's weights are loaded before the wait, so they stream while the kernel ahead
  // finishes (wq_a and wkv behind the hyper-connections' mix, wq_b behind q's norm): on an H100 the
  // batch-1 step −0.5% (docs/perf/2026-12-06-kv-row-placement.md). Asking L1 for the first 4 or 8
  // steps' lines as well slowed the kernels beside (q's norm, act_quant): +1–2%.
  if (kb_begin < kb_end) load_weights(kb_begin);
  pdl_wait();
  pdl_launch_dependents();
  if (kb_begin < kb_end) load_acts(kb_begin);
  for (int kb = kb_begin; kb < kb_end; ++kb) {
    const uint4 lo[2] = {next_lo[0], next_lo[1]}, hi[2] = {next_hi[0], next_hi[1]};
    uint4 x[kTiles][2];
    float sa[kTiles], sb[kTiles];
#pragma unroll
    for (int j = 0; j < kTiles; ++j) x[j][0] = next_x[j][0], x[j][1] = next_x[j][1], sa[j] = next_sa[j], sb[j] = next_sb[j];
    const float sw = next_sw;
    if (kb + 1 < kb_end) load_step(kb + 1);
    float part[kTiles][4] = {};
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint32_t a[4];
        weight_fragment(word(lo[c], s), word(hi[c], s), a);
#pragma unroll
        for (int j = 0; j < kTiles; ++j) {
          const uint32_t b = word(x[j][c], s);
          mma_f16(part[j], a, e4m3x2_to_f16x2(b), e4m3x2_to_f16x2(b >> 16));
        }
      }
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const float scale_a = sa[j] * sw, scale_b = sb[j] * sw;
      total[j][0] += part[j][0] * scale_a;
      total[j][1] += part[j][1] * scale_b;
      total[j][2] += part[j][2] * scale_a;
      total[j][3] += part[j][3] * scale_b;
    }
  }

  if (splits > 1) {
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) run_sum[warp][4 * j + i][lane] = total[j][i];
    __syncthreads();
    if (run != 0) return;
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float sum = run_sum[warp][4 * j + i][lane];
        for (int s = 1; s < splits; ++s) sum += run_sum[warp + s][4 * j + i][lane];
        total[j][i] = sum;
      }
  }
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const int64_t ra = row0 + 8 * j + 2 * t;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t r = ra + i;
      if (r >= rows) continue;
      if (y_f32) {  // linear_partial: the sums before the rounding
        if (lo_ok) y_f32[r * N + col0 + g] = total[j][i];
        if (hi_ok) y_f32[r * N + col0 + g + 8] = total[j][2 + i];
      } else {
        if (lo_ok) y[r * N + col0 + g] = bf16_bits(total[j][i]);
        if (hi_ok) y[r * N + col0 + g + 8] = bf16_bits(total[j][2 + i]);
      }
    }
  }
}

// Runs of K blocks per column tile (a power of two ≤ 8), from N and K only: enough warps in flight
// for a narrow linear, at least one K block per run.
int k_runs(int N, int K) {
  const int64_t tiles = (N + 15) / 16;
  int s = 1;
  while (s < kWarps && tiles * s < kTargetWarps && K / 128 >= 2 * s) s *= 2;
  return s;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <int kTiles>
void launch(const uint8_t* act_q, const float* act_scale, int64_t rows, int K, const Parts& parts, int groups,
            bool y_f32, cudaStream_t stream) {
  // Row blocks vary fastest: the blocks of one column group run together and share its weight in L2.
  const dim3 grid(unsigned((rows + kBlockRows - 1) / kBlockRows), unsigned(groups));
  launch_programmatic(linear_fp8_mma_kernel<kTiles>, grid, dim3(kWarps * 32), 0, stream, act_q, act_scale, rows, K, parts,
                      y_f32);
}

}  // namespace

void linear_fp8_block(const uint16_t* x, int64_t rows, int K, const uint8_t* w, const uint8_t* w_scale, int N,
                      uint8_t* act_q, float* act_scale, void* y, cudaStream_t stream, bool y_f32) {
  if (rows < 0 || rows > INT_MAX || K <= 0 || K % 128 || N <= 0)
    fail("linear_fp8_block: {} rows, K {} (a positive multiple of 128), N {}", rows, K, N);
  if (!aligned16(act_q)) fail("linear_fp8_block: act_q must be 16-byte aligned");
  if (rows == 0) return;
  act_quant_fp8(x, int(rows), K, act_q, act_scale, stream);
  DSV4_CUDA_CHECK_LAUNCH();
  const Fp8LinearOut out{w, w_scale, N, y};
  linear_fp8_block_quantised(act_q, act_scale, rows, K, &out, 1, stream, y_f32);
}

void linear_fp8_block_quantised(const uint8_t* act_q, const float* act_scale, int64_t rows, int K,
                                const Fp8LinearOut* outs, int n_outs, cudaStream_t stream, bool y_f32) {
  if (rows < 0 || rows > INT_MAX || K <= 0 || K % 128 || n_outs < 1 || n_outs > kMaxFp8LinearOuts)
    fail("linear_fp8_block: {} rows, K {} (a positive multiple of 128), {} weights (1 to {})", rows, K, n_outs,
         kMaxFp8LinearOuts);
  if (!aligned16(act_q)) fail("linear_fp8_block: act_q must be 16-byte aligned");
  if (rows == 0) return;
  Parts parts{};
  parts.count = n_outs;
  int64_t groups = 0;
  for (int i = 0; i < n_outs; ++i) {
    const Fp8LinearOut& o = outs[i];
    if (o.N <= 0 || !aligned16(o.w)) fail("linear_fp8_block: weight {} has N {} or is not 16-byte aligned", i, o.N);
    const int splits = k_runs(o.N, K);
    const int64_t tiles = (o.N + 15) / 16, per_block = kWarps / splits;
    parts.w[i] = o.w, parts.w_scale[i] = o.w_scale, parts.y[i] = o.y, parts.N[i] = o.N, parts.splits[i] = splits;
    parts.group0[i] = int(groups);
    groups += (tiles + per_block - 1) / per_block;
  }
  if (groups > 65535) fail("linear_fp8_block: {} column groups is too many (N up to ~1M columns)", groups);
  // Tiles per block row: only as many as the rows fill (a row's arithmetic is the same in each).
  const int64_t tiles = std::min<int64_t>((rows + 7) / 8, kMaxTiles);
  if (tiles == 1) launch<1>(act_q, act_scale, rows, K, parts, int(groups), y_f32, stream);
  else if (tiles == 2) launch<2>(act_q, act_scale, rows, K, parts, int(groups), y_f32, stream);
  else launch<4>(act_q, act_scale, rows, K, parts, int(groups), y_f32, stream);
  DSV4_CUDA_CHECK_LAUNCH();
}

}  // namespace dsv4::cuda
