// FP8 activation quantisation of SPEC.md §2.2 ("act_quant", block 128) on the GPU: the input of the
// reference's FP8 and FP4 linears. Per row and per 128 channels, amax floored at 1e-4, a power-of-two
// scale s = 2^ceil(log2(amax/448)) and q = e4m3(clamp(x/s, ±448)), bit for bit as
// cpu::quantize_fp8_block (backend/cpu/cpu_backend.h).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dsv4::cuda {

// act_quant_fp8's outputs for rows that an op writes (rms_norm, the hyper-connections' normed x_in)
// made by that op beside its bf16 output, so that the FP8 linears after it need no quantising launch:
// codes q [rows, cols], scales [rows, cols/128], and, if not null, the quantised values as bf16.
// Null q: none. Ops make them for widths act_quant_rows_fit accepts (whole warps of 16-byte chunks).
struct Fp8Rows {
  uint8_t* q = nullptr;
  float* scales = nullptr;
  uint16_t* values = nullptr;
};
inline bool act_quant_rows_fit(int64_t cols) { return cols > 0 && cols % 256 == 0; }

// x: bf16 [rows, cols] (cols a multiple of 128); q: e4m3 [rows, cols]; scales: f32 [rows, cols/128].
// Launched as a programmatic dependent (reads x after the previous kernel's writes are visible).
void act_quant_fp8(const uint16_t* x, int rows, int cols, uint8_t* q, float* scales, cudaStream_t stream);

// The same, and the quantised values as bf16 into values [rows, cols] (code · scale, exact): SPEC §2.2's
// quantisation as values, the bits of fp8_simulate_activations (row_ops.h).
void act_quant_fp8(const uint16_t* x, int rows, int cols, uint8_t* q, float* scales, uint16_t* values,
                   cudaStream_t stream);

// act_quant_fp8 of swiglu(gate, up, limit) (row_ops.h swiglu without row weights), [rows, cols]: the bits
// of the two in sequence; the SwiGLU's bf16 values are not stored.
void swiglu_act_quant_fp8(const uint16_t* gate, const uint16_t* up, int rows, int cols, float limit, uint8_t* q,
                          float* scales, cudaStream_t stream);

// The same codes and scales with the scales in the layout cuBLASLt's VEC128_32F block scaling takes
// for a GEMM's B operand (linear_gemm.h): scales[b · padded_rows + r], f32 [cols/128, padded_rows].
// The rows rows … padded_rows − 1 (the GEMM's padding to a multiple of 4) get zero codes and zero
// scales; q holds padded_rows rows.
void act_quant_fp8_mn_major(const uint16_t* x, int rows, int padded_rows, int cols, uint8_t* q, float* scales,
                            cudaStream_t stream);

}  // namespace dsv4::cuda
