// Elementwise and row ops of the CUDA backend: the CpuBackend ops of the same names
// (backend/cpu/cpu_backend.cpp, cpu_quant.cpp, cpu_moe.cpp) with the same rounding points.
// Every pointer is device memory; bf16 values are uint16_t bit patterns. Each function only enqueues
// on `stream` (no sync, no allocation, no host reads of device data), so it can be captured into a
// CUDA graph; kernels are launched as programmatic dependents (cuda_utils.h launch_programmatic).
// Where the CPU accumulates in double, these accumulate in f32 (another summation order): the
// results then differ only where a bf16 rounding falls within ~1e-6 of a midpoint (tests say how often).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/act_quant_fp8.h"

namespace dsv4::cuda {

// out[i·copies + c] = table[ids[i]] for c < copies (rows of `dim` bf16): the embedding, copied into
// the hyper-connection streams (SPEC §3.1). ids must be valid rows of table (not checked on the device).
void embed_rows(const int32_t* ids, int64_t n, const uint16_t* table, int dim, int copies, uint16_t* out,
                cudaStream_t stream);

// CpuBackend::rms_norm (SPEC §2.1): y = bf16(w ⊙ (x · rsqrt(mean(x²) + eps))), x, y [rows, n]. With
// quant.q, also act_quant_fp8 of y into quant (the bits of that op after this one), where
// rms_norm_quant_fits.
bool rms_norm_quant_fits(int n, const uint16_t* x, const uint16_t* weight, const uint16_t* y, const Fp8Rows& quant);
void rms_norm(const uint16_t* x, const uint16_t* weight, int64_t rows, int n, float eps, uint16_t* y,
              cudaStream_t stream, const Fp8Rows& quant = {});

// CpuBackend::head_rms_norm in place (SPEC §3.11.3): per head of head_dim, squares rounded to bf16,
// mean rounded to bf16, + eps rounded, rsqrt in f32 rounded to bf16 once.
void head_rms_norm(uint16_t* x, int64_t heads, int head_dim, float eps, cudaStream_t stream);

// CpuBackend::rope in place (SPEC §2.8): x [rows, heads, head_dim]; the last rope_dim dims of each head
// rotated as interleaved pairs by the f32 angle positions[row]·inv_freq[i] (inv_freq: rope_dim/2 f32),
// cos/sin in double as the CPU; inverse rotates by −angle. x must be 4-byte aligned.
// rope and head_norm_rope read positions before the programmatic wait (their cos/sin overlap the
// kernel ahead), so positions must not be written by the kernel just before them: the step
// descriptor's positions, uploaded before the step's kernels, are what the model passes.
void rope(uint16_t* x, int64_t rows, int heads, int head_dim, int rope_dim, const int32_t* positions,
          const float* inv_freq, bool inverse, cudaStream_t stream);

// head_rms_norm then rope (not inverse) in one launch, the bits of the two: x [rows, heads,
// head_dim] in place. A block per (row, 8 heads): for a decode step's few rows (prefill runs the two).
void head_norm_rope(uint16_t* x, int64_t rows, int heads, int head_dim, float eps, int rope_dim, const int32_t* positions,
                    const float* inv_freq, cudaStream_t stream);

// Backend::norm_rope in place: per head of head_dim (x [rows, heads, head_dim]), rms_norm with
// `weight`, rope by positions[row], then with fp8_nope fp8_simulate of the first head_dim − rope_dim
// channels: the bits of those kernels run one after another, in one launch. Like rope, it reads
// positions before the programmatic wait: they must not be written by the kernel just before it.
// For the shapes norm_rope_fits accepts (head_dim ≤ 512 and a multiple of 8, rope_dim ≤ 64, x and
// weight 16-byte aligned, with fp8_nope the rest a multiple of 64); callers run the separate ops
// otherwise.
bool norm_rope_fits(int head_dim, int rope_dim, const uint16_t* x, const uint16_t* weight, bool fp8_nope);
void norm_rope(uint16_t* x, int64_t rows, int heads, int head_dim, const uint16_t* weight, float eps, int rope_dim,
               const int32_t* positions, const float* inv_freq, bool fp8_nope, cudaStream_t stream);

// CpuBackend::fp8_simulate in place (SPEC §2.5): per row of row_width, the first `channels` (a multiple
// of 64) in blocks of 64 as cpu::fp8_simulate_block.
void fp8_simulate(uint16_t* x, int64_t rows, int row_width, int channels, cudaStream_t stream);
// The activation quantisation of SPEC §2.2 (cpu::quantize_fp8_block per 128 channels) as values in
// place: x ← bf16(e4m3(x / s) · s), exact in bf16. A bf16 GEMM on the result computes what the
// reference's FP8 GEMM computes, up to summation order.
void fp8_simulate_activations(uint16_t* x, int64_t rows, int cols, cudaStream_t stream);
// The same from src into x (src is not changed; the rows do not overlap unless src == x).
void fp8_simulate_activations(const uint16_t* src, uint16_t* x, int64_t rows, int cols, cudaStream_t stream);

// CpuBackend::hadamard_fp4_simulate(x, 128) in place (SPEC §2.6–2.7): per 128-vector cpu::hadamard128,
// then cpu::fp4_simulate_block per 32. x must be 8-byte aligned.
void hadamard_fp4_simulate(uint16_t* x, int64_t vectors, cudaStream_t stream);

void add_bf16(const uint16_t* a, const uint16_t* b, int64_t n, uint16_t* out, cudaStream_t stream);  // bf16(a + b)
void scale_bf16(const uint16_t* x, float s, int64_t n, uint16_t* out, cudaStream_t stream);         // bf16(x · s)
void f32_to_bf16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream);  // RNE as core/dtypes.h

// The clamped SwiGLU between an expert's GEMMs (cpu_moe.cpp run_expert, SPEC §3.7): gate/up bf16
// [rows, inter]; if limit > 0 up is clamped to ±limit and gate to ≤ limit; a = silu(gate)·up; if
// row_weights (f32 [rows], may be null) a = row_weights[r]·a; out bf16 [rows, inter].
void swiglu(const uint16_t* gate, const uint16_t* up, int64_t rows, int inter, float limit,
            const float* row_weights, uint16_t* out, cudaStream_t stream);

}  // namespace dsv4::cuda
