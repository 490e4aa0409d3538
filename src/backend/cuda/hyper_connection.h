// Hyper-connections on the GPU (SPEC §3.2 HC_PRE / HC_POST, §3.8 head): the CpuBackend ops of
// backend/cpu/cpu_hyper_connection.cpp step by step — same Sinkhorn order, same eps placements, same
// f32 rounding points. The one difference: the CPU accumulates the 24 dot products and the sum of
// squares in double, these in f32 sums (the dot products on the tensor cores, another order), so the
// mixes differ by ~1e-7 relative.
// Every pointer is device memory; bf16 values are uint16_t bit patterns; each function only enqueues
// on `stream` (graph-capturable). `ticket` (hc_pre, hc_post_pre, hc_head): null, or a zeroed counter
// that no other kernel uses meanwhile; with it a decode step's few rows (up to 2) run in one launch
// instead of two — the same bits — and the counter is zero again when the launch ends. hc_pre / hc_head take hc = 4 (DeepSeek-V4's stream count; see
// hyper_connection.cu for why no other), D a multiple of 4, X 8-byte and fn 16-byte aligned; hc_post
// takes hc = 1…4.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/act_quant_fp8.h"

namespace dsv4::cuda {

// The f32 scratch hc_pre (head = false) or hc_head (head = true) needs for T tokens: the partial sums
// of each token's channel slices (a token's result does not depend on T or on its neighbours).
int64_t hc_mix_scratch_floats(int64_t T, int hc, int D, bool head);

// Whether hc_pre / hc_head can apply a norm to their output themselves: D a multiple of 8 up to
// 8192, X, out and norm 16-byte aligned (the finishing block reads X 8 channels at a time).
bool hc_norm_fits(int D, const uint16_t* X, const uint16_t* out, const uint16_t* norm);
// Whether hc_pre / hc_post_pre with a norm can also write act_quant_fp8 of their output (`quant`,
// act_quant_fp8.h): D a multiple of 256, q 8-byte and values 16-byte aligned.
bool hc_norm_quant_fits(int D, const Fp8Rows& quant);

// CpuBackend::hc_pre. X bf16 [T, hc, D]; fn f32 [(2+hc)·hc, hc·D]; base f32 [(2+hc)·hc]; scale f32 [3].
// partials: hc_mix_scratch_floats(T, hc, D, false) floats. out bf16 [T, D]; post f32 [T, hc]; comb f32
// [T, hc, hc]. With norm (bf16 [D], hc_norm_fits): out = rms_norm(x, norm, norm_eps) of the result x,
// the bits of row_ops.h rms_norm run after it.
void hc_pre(const uint16_t* X, int64_t T, int hc, int D, const float* fn, const float* base, const float* scale,
            int iters, float norm_eps, float hc_eps, float* partials, const uint16_t* norm, uint16_t* out,
            float* post, float* comb, cudaStream_t stream, unsigned* ticket = nullptr, const Fp8Rows& quant = {});

// CpuBackend::hc_post: out[t,b,:] = bf16(post[t,b]·y[t,:] + Σ_a comb[t,a,b]·X[t,a,:]); y bf16 [T, D],
// X and out bf16 [T, hc, D] (out must not alias X).
void hc_post(const uint16_t* y, const uint16_t* X, const float* post, const float* comb, int64_t T, int hc, int D,
             uint16_t* out, cudaStream_t stream);

// hc_post then hc_pre of its result in two launches (the hc_pre's): X = hc_post(y, X_prev, post_prev,
// comb_prev) is computed by the partials kernel where it reads it, and written out; then hc_pre(X, …)
// into out, post, comb — the bits of hc_post then hc_pre. For a decode step's rows: T ≤
// kHcPostPreMaxRows (prefill keeps the two ops: the partials blocks of a slice would each re-read all
// streams). X must not alias X_prev; y, X_prev 8-byte aligned.
inline constexpr int64_t kHcPostPreMaxRows = 64;
void hc_post_pre(const uint16_t* y, const uint16_t* X_prev, const float* post_prev, const float* comb_prev, int64_t T,
                 int hc, int D, uint16_t* X, const float* fn, const float* base, const float* scale, int iters,
                 float norm_eps, float hc_eps, float* partials, const uint16_t* norm, uint16_t* out, float* post,
                 float* comb, cudaStream_t stream, unsigned* ticket = nullptr, const Fp8Rows& quant = {});

// CpuBackend::hc_head: fn f32 [hc, hc·D], base f32 [hc], scale f32 [1]; partials:
// hc_mix_scratch_floats(T, hc, D, true) floats; out bf16 [T, D]; norm as hc_pre's.
void hc_head(const uint16_t* X, int64_t T, int hc, int D, const float* fn, const float* base, const float* scale,
             float norm_eps, float hc_eps, float* partials, const uint16_t* norm, uint16_t* out,
             cudaStream_t stream, unsigned* ticket = nullptr);

}  // namespace dsv4::cuda
