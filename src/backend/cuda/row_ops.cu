// Elementwise and row ops (backend/cuda/row_ops.h): a block per row for the long reductions, a warp per
// head / quantisation block / Hadamard vector, grid-stride loops for the elementwise ops.
// Bit-exactness with the CPU twins rests on three rules: every f32 operation the CPU rounds separately
// is written with the _rn intrinsics (nvcc would otherwise contract a·b + c into one FMA; the CPU build
// has no FMA), divisions and square roots are the IEEE ones (__fdiv_rn, __fsqrt_rn), and the bf16 /
// e4m3 / e2m1 codecs are the bit-level ones of core/dtypes.h. Only reductions the CPU does in double
// are done here in f32 (another order), which is the one documented source of differences.
#include "backend/cuda/row_ops.h"

#include <climits>
#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/ptx_primitives.cuh"
#include "backend/cuda/quant_math.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

constexpr int kBlockThreads = 256;            // row kernels and elementwise kernels
constexpr int kWarpsPerBlock = kBlockThreads / 32;  // warp-per-item kernels
constexpr int kMaxRopePairs = 256;            // rope_dim ≤ 512
constexpr int64_t kSpreadRopeRows = 64;       // rows up to which rope spreads a row over several blocks
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float round_bf16_dev(float f) { return bf16_value(bf16_bits(f)); }

// core/dtypes.h e4m3_to_f32 for the finite codes (the clamp before encoding excludes NaN).
__device__ __forceinline__ float e4m3_value(uint8_t code) {
  const int e = (code >> 3) & 15, m = code & 7;
  const float v = e == 0 ? float(m) * 0x1p-9f : float(8 + m) * __uint_as_float(uint32_t(e - 10 + 127) << 23);
  return (code & 0x80) ? -v : v;
}

// core/dtypes.h f32_to_e2m1: nearest even on {0, .5, 1, 1.5, 2, 3, 4, 6}, sign kept for −0.
__device__ __forceinline__ uint32_t e2m1_code(float v) {
  const uint32_t sign = signbit(v) ? 8u : 0u;
  const float a = fabsf(v);
  uint32_t code;
  if (a <= 0.25f) code = 0;        // tie at .25 → 0 (even)
  else if (a < 0.75f) code = 1;    // tie at .75 → 1.0 (code 2, even)
  else if (a <= 1.25f) code = 2;   // tie at 1.25 → 1.0
  else if (a < 1.75f) code = 3;    // tie at 1.75 → 2.0
  else if (a <= 2.5f) code = 4;    // tie at 2.5 → 2.0
  else if (a < 3.5f) code = 5;     // tie at 3.5 → 4.0
  else if (a <= 5.0f) code = 6;    // tie at 5 → 4.0
  else code = 7;
  return sign | code;
}

__device__ __forceinline__ float e2m1_value(uint32_t code) {
  const uint32_t c = code & 7;
  const float m = c < 4 ? 0.5f * float(c) : (c == 7 ? 6.0f : float(c - 2));
  return (code & 8) ? -m : m;
}

// cpu::fp8_simulate_block on one value given its block's scale (SPEC §2.5, REF1).
__device__ __forceinline__ uint16_t fp8_simulated(float x, float s) {
  return bf16_bits(__fmul_rn(e4m3_value(to_e4m3(__fdiv_rn(x, s))), s));  // to_e4m3 clamps to ±448
}

// cpu::fp4_simulate_block on one value given its block's scale (SPEC §2.6).
__device__ __forceinline__ uint16_t fp4_simulated(float x, float s) {
  const float q = fminf(fmaxf(__fdiv_rn(x, s), -6.0f), 6.0f);
  return bf16_bits(__fmul_rn(e2m1_value(e2m1_code(q)), s));
}

template <typename Word>
__global__ void __launch_bounds__(kBlockThreads) embed_rows_kernel(const int32_t* __restrict__ ids,
                                                                   const Word* __restrict__ table, int words,
                                                                   int copies, Word* __restrict__ out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = blockIdx.x;
  const Word* src = table + int64_t(ids[i]) * words;  // int64: the vocabulary table exceeds 2^31 words
  for (int w = threadIdx.x; w < words; w += blockDim.x) {
    const Word v = src[w];
    for (int c = 0; c < copies; ++c) out[(i * copies + c) * words + w] = v;
  }
}

// 8 channels per thread and load where the row allows (n a multiple of 8, 16-byte aligned rows): a
// decode row of 4096 is then two loads per thread, not sixteen dependent ones.
// With quant.q (vec8 and act_quant_rows_fit(n): every loop step takes whole warps) each half warp also
// quantises the 128 channels it wrote (act_quant_half_warp8).
__global__ void __launch_bounds__(kBlockThreads) rms_norm_kernel(const uint16_t* __restrict__ x,
                                                                 const uint16_t* __restrict__ weight, int n,
                                                                 float eps, bool vec8, uint16_t* __restrict__ y,
                                                                 const Fp8Rows quant) {
  pdl_wait();
  pdl_launch_dependents();
  const uint16_t* xr = x + int64_t(blockIdx.x) * n;
  uint16_t* yr = y + int64_t(blockIdx.x) * n;
  const int step = vec8 ? 8 : 1;
  float ss = 0;
  for (int i = threadIdx.x * step; i < n; i += blockDim.x * step) {
    if (vec8) {
      ss = add_squares8(*reinterpret_cast<const uint4*>(xr + i), ss);
    } else {
      const float v = bf16_value(xr[i]);
      ss = fmaf(v, v, ss);
    }
  }
  const float rs = rms_inverse(block_sum(ss), n, eps);
  for (int i = threadIdx.x * step; i < n; i += blockDim.x * step) {
    if (vec8) {
      const uint4 out = rms_scale8(*reinterpret_cast<const uint4*>(xr + i), *reinterpret_cast<const uint4*>(weight + i), rs);
      *reinterpret_cast<uint4*>(yr + i) = out;
      if (quant.q) {
        const int64_t at = int64_t(blockIdx.x) * n + i;
        act_quant_half_warp8(out, quant.q + at, quant.scales + at / 128, quant.values ? quant.values + at : nullptr);
      }
    } else {
      yr[i] = bf16_bits(__fmul_rn(bf16_value(weight[i]), __fmul_rn(bf16_value(xr[i]), rs)));
    }
  }
}

// SPEC §3.11.3's per-head norm of the warp's head of head_dim, in place.
__device__ __forceinline__ void head_rms_norm_warp(uint16_t* v, int head_dim, float eps, int lane) {
  float sum = 0;
  for (int i = lane; i < head_dim; i += 32) {
    const float f = bf16_value(v[i]);
    sum = __fadd_rn(sum, round_bf16_dev(__fmul_rn(f, f)));
  }
  sum = warp_sum(sum);
  const float mean = round_bf16_dev(__fdiv_rn(sum, float(head_dim)));
  const float var = round_bf16_dev(__fadd_rn(mean, eps));
  const float r = round_bf16_dev(__fdiv_rn(1.0f, __fsqrt_rn(var)));
  for (int i = lane; i < head_dim; i += 32) v[i] = bf16_bits(__fmul_rn(bf16_value(v[i]), r));
}

// A warp per head.
__global__ void __launch_bounds__(kBlockThreads) head_rms_norm_kernel(uint16_t* __restrict__ x, int64_t heads,
                                                                      int head_dim, float eps) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t head = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (head >= heads) return;  // whole warps leave together
  head_rms_norm_warp(x + head * head_dim, head_dim, eps, lane);
}

// The row's cos/sin of each rope pair into shared memory, by the whole block (a barrier follows):
// the f32 angle (torch.outer in f32), cos/sin in double rounded to f32, as the CPU; sin negated for
// the inverse rotation.
__device__ __forceinline__ void row_rope_table(float pos, const float* __restrict__ inv_freq, int pairs, bool inverse,
                                               float* cos_pair, float* sin_pair) {
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const double angle = double(__fmul_rn(pos, inv_freq[i]));
    const float s = float(sin(angle));
    cos_pair[i] = float(cos(angle));
    sin_pair[i] = inverse ? -s : s;
  }
}

// One interleaved bf16 pair rotated by (c, s), each result rounded to bf16 (SPEC §2.8).
__device__ __forceinline__ void rotate_pair(uint32_t* pair, float c, float s) {
  const uint32_t w = *pair;
  const float a = __uint_as_float(w << 16), b = __uint_as_float(w & 0xffff0000u);
  const float even = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  const float odd = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
  *pair = uint32_t(bf16_bits(even)) | uint32_t(bf16_bits(odd)) << 16;
}

// head_norm_rope for a decode step's few rows: block (row, group of kWarpsPerBlock heads), the row's
// cos/sin once in shared memory as rope_kernel computes them, a warp per head: the norm (written back,
// as head_rms_norm_kernel writes it), then RoPE of the last rope_dim channels from those bf16 values —
// the bits of the two kernels one after the other, in one launch. (Prefill keeps the two kernels: with
// thousands of rows they were faster than any fused form, see norm_rope_kernel.)
__global__ void __launch_bounds__(kBlockThreads)
    head_norm_rope_kernel(uint16_t* __restrict__ x, int heads, int head_dim, float eps, int rope_dim,
                          const int32_t* __restrict__ positions, const float* __restrict__ inv_freq) {
  __shared__ float cos_pair[kMaxRopePairs], sin_pair[kMaxRopePairs];
  const int64_t row = blockIdx.x;
  const int pairs = rope_dim / 2;
  row_rope_table(float(positions[row]), inv_freq, pairs, false, cos_pair, sin_pair);  // (before the wait: see rope_kernel)
  __syncthreads();
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32, head = int(blockIdx.y) * kWarpsPerBlock + threadIdx.x / 32;
  if (head >= heads) return;  // whole warps leave together
  uint16_t* v = x + (row * heads + head) * head_dim;
  head_rms_norm_warp(v, head_dim, eps, lane);
  __syncwarp();  // the normalised values, as the rope kernel would read them
  uint16_t* r = v + (head_dim - rope_dim);
  for (int i = lane; i < pairs; i += 32) rotate_pair(reinterpret_cast<uint32_t*>(r + 2 * i), cos_pair[i], sin_pair[i]);
}

// Blocks (row, part): the row's cos/sin in each block's shared memory, then the part's share of the
// row's (head, pair) items. A decode row's 2048 pairs in one block made each thread walk 8 of them one
// dependent memory round trip after another (~4 µs on the step's chain); its row is spread over
// gridDim.y blocks, a pair a thread (rope()).
__global__ void __launch_bounds__(kBlockThreads) rope_kernel(uint16_t* __restrict__ x, int heads, int head_dim,
                                                             int rope_dim, const int32_t* __restrict__ positions,
                                                             const float* __restrict__ inv_freq, bool inverse) {
  __shared__ float cos_pair[kMaxRopePairs], sin_pair[kMaxRopePairs];
  const int64_t row = blockIdx.x;
  const int pairs = rope_dim / 2;
  // The table before the programmatic wait, so that its double-precision cos/sin overlap the kernel
  // ahead: positions must not be that kernel's output (row_ops.h).
  row_rope_table(float(positions[row]), inv_freq, pairs, inverse, cos_pair, sin_pair);
  __syncthreads();
  pdl_wait();
  pdl_launch_dependents();
  uint16_t* xr = x + row * heads * head_dim + (head_dim - rope_dim);
  for (int idx = blockIdx.y * blockDim.x + threadIdx.x; idx < heads * pairs; idx += gridDim.y * blockDim.x) {
    const int h = idx / pairs, i = idx % pairs;
    rotate_pair(reinterpret_cast<uint32_t*>(xr + int64_t(h) * head_dim + 2 * i), cos_pair[i], sin_pair[i]);
  }
}

// norm_rope: a block per head, a warp per 64 channels of it, a lane per channel pair. Each warp sums
// the head's squares itself, in rms_norm_kernel's order (chunk c of 8 channels by thread c, warp sums
// added in warp order), so every warp holds the same inverse norm without waiting for another; after
// a barrier (every warp has read the head before any writes it) a lane writes its pair: rotated (the
// pairs past head_dim − rope_dim), else the normalised values, fp8-simulated per 64-channel block (the
// warp's block). Each step repeats the arithmetic of its own kernel above, so the outputs are the bits
// of rms_norm, rope, fp8_simulate run one after another. A rotated lane's cos/sin (double precision,
// as rope_kernel) are computed before the programmatic wait, as rope's are: the positions must not be
// the output of the op just before (row_ops.h). The form before (a warp walking a head's blocks one
// after another through 8 KB of shared memory, cos/sin after the wait) took 6.3–8.5 µs from start to
// end at one KV row, this one 4.7–5.1; the old one was also placed beside wq_b's resident blocks only
// as they drained in two of three traced runs, this one in both traced runs at once
// (docs/perf/2026-12-06-kv-row-placement.md).
// (q's per-head norm stays the two ops: with 64 heads a row, a fused kernel recomputing cos/sin per
// head or sharing them per block measured slower at prefill than head_rms_norm + rope.)
constexpr int kMaxNormRopeDim = 512;
constexpr int kMaxNormRopePairs = 32;

__global__ void __launch_bounds__(kMaxNormRopeDim / 2)
    norm_rope_kernel(uint16_t* __restrict__ x, int heads, int head_dim, const uint16_t* __restrict__ weight,
                     float eps, int rope_dim, const int32_t* __restrict__ positions,
                     const float* __restrict__ inv_freq, bool fp8_nope) {
  const int64_t item = blockIdx.x;
  const int lane = threadIdx.x % 32, nope = head_dim - rope_dim;
  const int c = 2 * int(threadIdx.x);  // this lane's pair: channels c, c + 1 (64 a warp)
  const bool in_head = c < head_dim, rotated = in_head && c >= nope;
  float cs = 0.f, sn = 0.f;
  if (rotated) {
    // The f32 angle (torch.outer in f32), cos/sin in double rounded to f32, as the CPU (rope_kernel).
    const double angle = double(__fmul_rn(float(positions[item / heads]), inv_freq[(c - nope) / 2]));
    cs = float(cos(angle)), sn = float(sin(angle));
  }
  pdl_wait();
  pdl_launch_dependents();
  uint16_t* v = x + item * head_dim;
  const int chunks = head_dim / 8;
  float total = 0;
  for (int c0 = 0; c0 < chunks; c0 += 32) {
    const float ss = c0 + lane < chunks ? add_squares8(reinterpret_cast<const uint4*>(v)[c0 + lane], 0.f) : 0.f;
    total += warp_sum(ss);
  }
  const float rs = rms_inverse(total, head_dim, eps);
  const uint32_t xw = in_head ? reinterpret_cast<const uint32_t*>(v)[c / 2] : 0u;
  const uint32_t ww = in_head ? reinterpret_cast<const uint32_t*>(weight)[c / 2] : 0u;
  __syncthreads();
  // rms_scale8's arithmetic on one word: the normalised pair, each rounded to bf16.
  const float a = bf16_value(bf16_bits(__fmul_rn(__uint_as_float(ww << 16), __fmul_rn(__uint_as_float(xw << 16), rs))));
  const float b = bf16_value(
      bf16_bits(__fmul_rn(__uint_as_float(ww & 0xffff0000u), __fmul_rn(__uint_as_float(xw & 0xffff0000u), rs))));
  uint32_t* out = reinterpret_cast<uint32_t*>(v + c);
  if (rotated) {
    const float even = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
    const float odd = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
    *out = uint32_t(bf16_bits(even)) | uint32_t(bf16_bits(odd)) << 16;
  } else if (in_head && fp8_nope) {  // (nope is a multiple of 64: the warp's lanes are one block)
    const float amax = warp_max(fmaxf(fabsf(a), fabsf(b)));
    const float s = pow2_ceil_dev(__fmul_rn(fmaxf(amax, 1e-4f), 1.0f / 448.0f));  // cpu::fp8_block_scale
    *out = uint32_t(fp8_simulated(a, s)) | uint32_t(fp8_simulated(b, s)) << 16;
  } else if (in_head) {
    *out = uint32_t(bf16_bits(a)) | uint32_t(bf16_bits(b)) << 16;
  }
}

// A warp per kBlock-channel block; lane holds channels lane, lane + 32, … (64: the KV simulation of
// SPEC §2.5; 128: the activation quantisation of §2.2, as values). Reads src, writes x (src == x: in
// place; a thread reads its values before it writes them, hence no __restrict__).
template <int kBlock>
__global__ void __launch_bounds__(kBlockThreads) fp8_simulate_kernel(const uint16_t* src, uint16_t* x, int64_t blocks,
                                                                     int blocks_per_row, int row_width) {
  constexpr int kPerLane = kBlock / 32;
  pdl_wait();
  pdl_launch_dependents();
  const int64_t block = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (block >= blocks) return;
  const int64_t at = (block / blocks_per_row) * row_width + (block % blocks_per_row) * kBlock;
  const uint16_t* u = src + at;
  uint16_t* v = x + at;
  float f[kPerLane];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    f[i] = bf16_value(u[lane + 32 * i]);
    amax = fmaxf(amax, fabsf(f[i]));
  }
  amax = warp_max(amax);
  const float s = pow2_ceil_dev(__fmul_rn(fmaxf(amax, 1e-4f), 1.0f / 448.0f));  // cpu::fp8_block_scale
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) v[lane + 32 * i] = fp8_simulated(f[i], s);
}

// A warp per 128-vector; lane holds elements 4·lane … 4·lane + 3. The butterflies are those of
// cpu::hadamard128 stage by stage (stage h pairs j with j + h: (a, b) → (a + b, a − b)), so every
// value sees the same f32 operations on the same operands. Stages h < 4 stay inside a lane; for
// h ≥ 4 the partner is lane ^ (h / 4), and the upper element of a pair takes partner − own.
__global__ void __launch_bounds__(kBlockThreads) hadamard_fp4_kernel(uint16_t* __restrict__ x, int64_t vectors,
                                                                     float hadamard_scale) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t vector = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (vector >= vectors) return;
  uint2* word = reinterpret_cast<uint2*>(x + vector * 128 + lane * 4);
  const uint2 raw = *word;
  float v[4] = {__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xffff0000u), __uint_as_float(raw.y << 16),
                __uint_as_float(raw.y & 0xffff0000u)};
  for (int h = 1; h < 4; h *= 2)
    for (int j = 0; j < 4; ++j)
      if (!(j & h)) {
        const float a = v[j], b = v[j + h];
        v[j] = __fadd_rn(a, b);
        v[j + h] = __fsub_rn(a, b);
      }
  for (int h = 4; h < 128; h *= 2) {
    const int partner_bit = h / 4;
    const bool upper = lane & partner_bit;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float other = __shfl_xor_sync(kFullMask, v[j], partner_bit);
      v[j] = upper ? __fsub_rn(other, v[j]) : __fadd_rn(v[j], other);
    }
  }
  float r[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) r[j] = round_bf16_dev(__fmul_rn(v[j], hadamard_scale));
  // FP4 per 32 (8 lanes) on the bf16 values (cpu::fp4_simulate_block, scale cpu::fp4_block_scale).
  float amax = fmaxf(fmaxf(fabsf(r[0]), fabsf(r[1])), fmaxf(fabsf(r[2]), fabsf(r[3])));
#pragma unroll
  for (int o = 1; o < 8; o *= 2) amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, o));
  const float s = pow2_ceil_dev(__fmul_rn(fmaxf(amax, 0x1.8p-124f /* 6·2^-126 */), 1.0f / 6.0f));
  *word = make_uint2(uint32_t(fp4_simulated(r[0], s)) | uint32_t(fp4_simulated(r[1], s)) << 16,
                     uint32_t(fp4_simulated(r[2], s)) | uint32_t(fp4_simulated(r[3], s)) << 16);
}

__global__ void __launch_bounds__(kBlockThreads) add_bf16_kernel(const uint16_t* __restrict__ a,
                                                                 const uint16_t* __restrict__ b, int64_t n,
                                                                 uint16_t* __restrict__ out) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = bf16_bits(__fadd_rn(bf16_value(a[i]), bf16_value(b[i])));
}

__global__ void __launch_bounds__(kBlockThreads) scale_bf16_kernel(const uint16_t* __restrict__ x, float s,
                                                                   int64_t n, uint16_t* __restrict__ out) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = bf16_bits(__fmul_rn(bf16_value(x[i]), s));
}

__global__ void __launch_bounds__(kBlockThreads) f32_to_bf16_kernel(const float* __restrict__ x, int64_t n,
                                                                    uint16_t* __restrict__ out) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = bf16_bits(x[i]);
}

__global__ void __launch_bounds__(kBlockThreads) swiglu_kernel(const uint16_t* __restrict__ gate,
                                                               const uint16_t* __restrict__ up, int64_t n, int inter,
                                                               float limit, const float* __restrict__ row_weights,
                                                               uint16_t* __restrict__ out) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float a = swiglu_value(bf16_value(gate[i]), bf16_value(up[i]), limit);
    if (row_weights) a = __fmul_rn(row_weights[i / inter], a);
    out[i] = bf16_bits(a);
  }
}

// Blocks for a grid-stride loop over n elements: enough to fill any GPU, few enough to loop.
unsigned elementwise_blocks(int64_t n) {
  const int64_t needed = (n + kBlockThreads - 1) / kBlockThreads;
  return unsigned(needed < 65536 ? needed : 65536);
}

void check_grid(int64_t blocks, const char* op) {
  if (blocks > 0x7fffffff) fail("{}: {} blocks exceed the grid limit", op, blocks);
}

// The grid of a warp-per-item kernel.
dim3 warp_item_grid(int64_t items, const char* op) {
  const int64_t blocks = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  check_grid(blocks, op);
  return dim3(unsigned(blocks));
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

void embed_rows(const int32_t* ids, int64_t n, const uint16_t* table, int dim, int copies, uint16_t* out,
                cudaStream_t stream) {
  if (dim <= 0 || copies <= 0) fail("embed_rows: dim {} copies {}", dim, copies);
  if (n <= 0) return;
  check_grid(n, "embed_rows");
  // 16-byte words when every row starts 16-byte aligned (the Flash width 4096 does), bf16 otherwise.
  if (dim % 8 == 0 && aligned(table, 16) && aligned(out, 16))
    launch_programmatic(embed_rows_kernel<uint4>, dim3(unsigned(n)), dim3(kBlockThreads), 0, stream, ids,
                        reinterpret_cast<const uint4*>(table), dim / 8, copies, reinterpret_cast<uint4*>(out));
  else
    launch_programmatic(embed_rows_kernel<uint16_t>, dim3(unsigned(n)), dim3(kBlockThreads), 0, stream, ids, table,
                        dim, copies, out);
}

bool rms_norm_quant_fits(int n, const uint16_t* x, const uint16_t* weight, const uint16_t* y, const Fp8Rows& quant) {
  return act_quant_rows_fit(n) && aligned(x, 16) && aligned(weight, 16) && aligned(y, 16) && aligned(quant.q, 8) &&
         aligned(quant.values, 16);
}

void rms_norm(const uint16_t* x, const uint16_t* weight, int64_t rows, int n, float eps, uint16_t* y,
              cudaStream_t stream, const Fp8Rows& quant) {
  if (n <= 0) fail("rms_norm: width {}", n);
  if (quant.q && !rms_norm_quant_fits(n, x, weight, y, quant))
    fail("rms_norm: no FP8 codes beside a row of {} (rms_norm_quant_fits)", n);
  if (rows <= 0) return;
  check_grid(rows, "rms_norm");
  const bool vec8 = n % 8 == 0 && aligned(x, 16) && aligned(weight, 16) && aligned(y, 16);
  launch_programmatic(rms_norm_kernel, dim3(unsigned(rows)), dim3(kBlockThreads), 0, stream, x, weight, n, eps, vec8,
                      y, quant);
}

void head_rms_norm(uint16_t* x, int64_t heads, int head_dim, float eps, cudaStream_t stream) {
  if (head_dim <= 0) fail("head_rms_norm: head_dim {}", head_dim);
  if (heads <= 0) return;
  launch_programmatic(head_rms_norm_kernel, warp_item_grid(heads, "head_rms_norm"), dim3(kBlockThreads), 0, stream,
                      x, heads, head_dim, eps);
}

void rope(uint16_t* x, int64_t rows, int heads, int head_dim, int rope_dim, const int32_t* positions,
          const float* inv_freq, bool inverse, cudaStream_t stream) {
  if (heads <= 0 || head_dim % 2 || rope_dim <= 0 || rope_dim % 2 || rope_dim > head_dim ||
      rope_dim / 2 > kMaxRopePairs)
    fail("rope: {} heads of {}, rope_dim {} (even, ≤ head_dim, ≤ {})", heads, head_dim, rope_dim, 2 * kMaxRopePairs);
  if (!aligned(x, 4)) fail("rope: x must be 4-byte aligned");
  if (rows <= 0) return;
  check_grid(rows, "rope");
  const int work = heads * (rope_dim / 2);
  const int threads = work >= kBlockThreads ? kBlockThreads : (work + 31) / 32 * 32;
  // A decode step's few rows: a block per kBlockThreads pairs (each block computes the row's table, before
  // the programmatic wait); a prefill chunk's rows: a block per row.
  const unsigned parts = rows <= kSpreadRopeRows ? unsigned((work + threads - 1) / threads) : 1u;
  launch_programmatic(rope_kernel, dim3(unsigned(rows), parts), dim3(threads), 0, stream, x, heads, head_dim, rope_dim,
                      positions, inv_freq, inverse);
}

void head_norm_rope(uint16_t* x, int64_t rows, int heads, int head_dim, float eps, int rope_dim, const int32_t* positions,
                    const float* inv_freq, cudaStream_t stream) {
  if (heads <= 0 || head_dim <= 0 || head_dim % 2 || rope_dim <= 0 || rope_dim % 2 || rope_dim > head_dim ||
      rope_dim / 2 > kMaxRopePairs)
    fail("head_norm_rope: {} heads of {}, rope_dim {} (even, ≤ head_dim, ≤ {})", heads, head_dim, rope_dim,
         2 * kMaxRopePairs);
  if (!aligned(x, 4)) fail("head_norm_rope: x must be 4-byte aligned");
  if (rows <= 0) return;
  check_grid(rows, "head_norm_rope");
  launch_programmatic(head_norm_rope_kernel, dim3(unsigned(rows), unsigned((heads + kWarpsPerBlock - 1) / kWarpsPerBlock)),
                      dim3(kBlockThreads), 0, stream, x, heads, head_dim, eps, rope_dim, positions, inv_freq);
}

bool norm_rope_fits(int head_dim, int rope_dim, const uint16_t* x, const uint16_t* weight, bool fp8_nope) {
  const int nope = head_dim - rope_dim;
  return head_dim > 0 && head_dim <= kMaxNormRopeDim && head_dim % 8 == 0 && rope_dim > 0 && rope_dim % 2 == 0 &&
         rope_dim / 2 <= kMaxNormRopePairs && nope >= 0 && (!fp8_nope || nope % 64 == 0) && aligned(x, 16) &&
         weight && aligned(weight, 16);
}

void norm_rope(uint16_t* x, int64_t rows, int heads, int head_dim, const uint16_t* weight, float eps, int rope_dim,
               const int32_t* positions, const float* inv_freq, bool fp8_nope, cudaStream_t stream) {
  if (heads <= 0 || !norm_rope_fits(head_dim, rope_dim, x, weight, fp8_nope))
    fail("norm_rope: {} heads of {}, rope_dim {}{} (see norm_rope_fits)", heads, head_dim, rope_dim,
         fp8_nope ? ", fp8 on the rest" : "");
  if (rows <= 0) return;
  const int64_t items = rows * heads;
  if (items > INT_MAX) fail("norm_rope: {} heads in one launch", items);
  launch_programmatic(norm_rope_kernel, dim3(unsigned(items)), dim3(32 * ((head_dim + 63) / 64)), 0, stream, x, heads,
                      head_dim, weight, eps, rope_dim, positions, inv_freq, fp8_nope);
}

void fp8_simulate(uint16_t* x, int64_t rows, int row_width, int channels, cudaStream_t stream) {
  if (channels < 0 || channels % 64 || channels > row_width)
    fail("fp8_simulate: {} channels of a {}-wide row (a multiple of 64 within the row)", channels, row_width);
  const int blocks_per_row = channels / 64;
  const int64_t blocks = rows * blocks_per_row;
  if (blocks <= 0) return;
  launch_programmatic(fp8_simulate_kernel<64>, warp_item_grid(blocks, "fp8_simulate"), dim3(kBlockThreads), 0, stream,
                      x, x, blocks, blocks_per_row, row_width);
}

void fp8_simulate_activations(const uint16_t* src, uint16_t* x, int64_t rows, int cols, cudaStream_t stream) {
  if (cols <= 0 || cols % 128) fail("fp8_simulate_activations: {} columns (a multiple of 128)", cols);
  const int64_t blocks = rows * (cols / 128);
  if (blocks <= 0) return;
  launch_programmatic(fp8_simulate_kernel<128>, warp_item_grid(blocks, "fp8_simulate_activations"), dim3(kBlockThreads),
                      0, stream, src, x, blocks, cols / 128, cols);
}

void fp8_simulate_activations(uint16_t* x, int64_t rows, int cols, cudaStream_t stream) {
  fp8_simulate_activations(x, x, rows, cols, stream);
}

void hadamard_fp4_simulate(uint16_t* x, int64_t vectors, cudaStream_t stream) {
  if (!aligned(x, 8)) fail("hadamard_fp4_simulate: x must be 8-byte aligned");
  if (vectors <= 0) return;
  const float hadamard_scale = float(1.0 / std::sqrt(128.0));  // the CPU's constant
  launch_programmatic(hadamard_fp4_kernel, warp_item_grid(vectors, "hadamard_fp4_simulate"), dim3(kBlockThreads), 0,
                      stream, x, vectors, hadamard_scale);
}

void add_bf16(const uint16_t* a, const uint16_t* b, int64_t n, uint16_t* out, cudaStream_t stream) {
  if (n <= 0) return;
  launch_programmatic(add_bf16_kernel, dim3(elementwise_blocks(n)), dim3(kBlockThreads), 0, stream, a, b, n, out);
}

void scale_bf16(const uint16_t* x, float s, int64_t n, uint16_t* out, cudaStream_t stream) {
  if (n <= 0) return;
  launch_programmatic(scale_bf16_kernel, dim3(elementwise_blocks(n)), dim3(kBlockThreads), 0, stream, x, s, n, out);
}

void f32_to_bf16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream) {
  if (n <= 0) return;
  launch_programmatic(f32_to_bf16_kernel, dim3(elementwise_blocks(n)), dim3(kBlockThreads), 0, stream, x, n, out);
}

void swiglu(const uint16_t* gate, const uint16_t* up, int64_t rows, int inter, float limit, const float* row_weights,
            uint16_t* out, cudaStream_t stream) {
  if (inter <= 0) fail("swiglu: width {}", inter);
  const int64_t n = rows * inter;
  if (n <= 0) return;
  launch_programmatic(swiglu_kernel, dim3(elementwise_blocks(n)), dim3(kBlockThreads), 0, stream, gate, up, n, inter,
                      limit, row_weights, out);
}

}  // namespace dsv4::cuda
