// The dense linears of the CUDA backend (SPEC §2.2–2.3, §3.3, §3.7, §3.8), kernels shaped for decode
// and short prefill. FP8 block weights: tensor cores (linear_fp8_mma.cu: the weight read once, f32
// promotion per 128-channel block as the reference). bf16 weights: CUDA cores, one warp per output
// column reading its weight row once for up to 8 input rows per pass (a block covers 8 columns × 64
// rows; narrow linears split K over several warps per column), f32 accumulation, one rounding at the
// output. From the row counts of linear_gemm.h CudaBackend runs the bf16-input linears, and from more
// rows the FP8 ones as bf16 GEMMs of their exact dequantised values, on cuBLASLt instead; these
// kernels stay the decode path, the f32-input path and the fallback wherever cuBLASLt cannot run a
// shape. All pointers are device memory; functions only enqueue.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dsv4::cuda {

// CpuBackend::linear for FP8_BLOCK weights: x bf16 [rows, K] is quantised by act_quant_fp8 into the
// caller's scratch act_q e4m3 [rows, K] and act_scale f32 [rows, K/128], then
// y[r, n] = bf16(Σ_b sx[r, b] · sw[n/128, b] · Σ_{k ∈ b} xq·wq). w e4m3 [N, K]; w_scale ue8m0 bytes
// [ceil(N/128), K/128]. K a positive multiple of 128; N any; rows < 2^31. w and act_q 16-byte aligned.
// y bf16 [rows, N], or with y_f32 the f32 sums before that rounding (Backend::linear_partial).
// Runs on the tensor cores (linear_fp8_mma.cu).
void linear_fp8_block(const uint16_t* x, int64_t rows, int K, const uint8_t* w, const uint8_t* w_scale, int N,
                      uint8_t* act_q, float* act_scale, void* y, cudaStream_t stream, bool y_f32 = false);

// One FP8_BLOCK weight of a multi-weight launch, and where its result goes (bf16 or f32 as above).
struct Fp8LinearOut {
  const uint8_t* w = nullptr;
  const uint8_t* w_scale = nullptr;
  int N = 0;
  void* y = nullptr;
};
constexpr int kMaxFp8LinearOuts = 3;

// linear_fp8_block's second half for up to kMaxFp8LinearOuts weights of one input, in one launch:
// act_q / act_scale as act_quant_fp8 wrote them for x [rows, K]. Each output has the bits
// linear_fp8_block gives for its weight alone (a weight's work split depends on its N and K only).
// Why: the linears that read one activation (attention's wq_a and wkv, the shared expert's w1 and
// w3) quantise it once and fill the GPU together — at decode each alone is a few dozen blocks.
void linear_fp8_block_quantised(const uint8_t* act_q, const float* act_scale, int64_t rows, int K,
                                const Fp8LinearOut* outs, int n_outs, cudaStream_t stream, bool y_f32 = false);

// CpuBackend::linear_bf16 / linear_f32 / grouped_out_proj / logits:
// y[r, j] = Σ_k x[r·x_row_stride + g(j)·K + k] · w[j·K + k], g(j) = j / (N / groups).
// x bf16 (or f32 when x_f32), w bf16 [N, K], f32 accumulation; y bf16 [rows, N] rounded once, or
// f32 when y_f32. N a multiple of groups. 16-byte loads when K and x_row_stride are multiples of 8
// and x, w are 16-byte aligned; element loads otherwise.
void linear_bf16w(const void* x, bool x_f32, int64_t rows, int K, int64_t x_row_stride, int groups, const uint16_t* w,
                  int N, void* y, bool y_f32, cudaStream_t stream);

// linear_bf16w (x bf16, groups as there) for an FP8_BLOCK weight, on the tensor cores
// (linear_fp8w_mma.cu): w e4m3 [N, K], w_scale ue8m0 [⌈N/128⌉, ⌈K/128⌉], each weight taken as its
// exact bf16 value code × scale (how the reference runs wo_a). The products (exact in f32) are summed
// per 128-channel scale block by the tensor core and the blocks added in f32: not linear_bf16w's
// bits on those values. Needs linear_fp8w_mma_available: K and each group's columns (N / groups)
// multiples of 128, x_row_stride of 8, x and w 16-byte aligned. workspace: f32,
// linear_fp8w_mma_workspace bytes (0: none needed); a row's result does not depend on `rows`. y bf16,
// or with y_f32 the f32 sums before that rounding.
bool linear_fp8w_mma_available(int64_t rows, int K, int64_t x_row_stride, int groups, int N, const void* x,
                               const uint8_t* w);
size_t linear_fp8w_mma_workspace(int64_t rows, int K, int N);
void linear_fp8w_mma(const uint16_t* x, int64_t rows, int K, int64_t x_row_stride, int groups, const uint8_t* w,
                     const uint8_t* w_scale, int N, void* y, float* workspace, cudaStream_t stream, bool y_f32 = false);

// One bf16 weight [N, K] of a multi-weight launch, and its output [rows, N] (bf16 or f32 as above).
struct Bf16wOut {
  const uint16_t* w = nullptr;
  int N = 0;
  void* y = nullptr;
};
constexpr int kMaxBf16wOuts = 4;

// linear_bf16w (groups 1, x rows dense) for up to kMaxBf16wOuts weights of one input x [rows, K], in
// one launch. Each output has the bits linear_bf16w gives for its weight alone (a weight's split of
// K depends on its N and K only). Why: a decode row's compressor projections (the compressor's wkv
// and wgate, in CSA the indexer compressor's too) are each a few dozen blocks, and one after another
// they were a chain of four launches on the compressors' branch.
void linears_bf16w(const void* x, bool x_f32, int64_t rows, int K, const Bf16wOut* outs, int n_outs, bool y_f32,
                   cudaStream_t stream);

// FP8 block codes → their exact values in bf16 (an e4m3 code times a power-of-two scale is a bf16
// value), for running an FP8_BLOCK linear as a bf16 GEMM with the same products (linear_gemm.h).
// Weights: w e4m3 [N, K] with ue8m0 scales [⌈N/128⌉, K/128]; activations: q e4m3 [rows, K] with
// act_quant_fp8's f32 scales [rows, K/128]. out bf16, same shape. K a multiple of 128; all 16-byte aligned.
void fp8_weight_to_bf16(const uint8_t* w, const uint8_t* w_scale, int64_t N, int K, uint16_t* out, cudaStream_t stream);
void fp8_rows_to_bf16(const uint8_t* q, const float* scale, int64_t rows, int K, uint16_t* out, cudaStream_t stream);

}  // namespace dsv4::cuda
