// Device-side pieces shared by the FP4 MoE GEMM kernels (moe_fp4.cu, moe_fp4_stream.cu): the
// argument block, the e2m1 → bf16 unpacking with the folded block scale, the bf16 MMA and the
// per-fragment epilogue. The weight and scale layouts are described in moe_fp4.h.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "backend/cuda/moe_fp4.h"
#include "backend/cuda/ptx_primitives.cuh"

namespace dsv4::cuda::moe_detail {

struct GemmArgs {
  const uint8_t* weights;  // all experts, unit layout
  const uint8_t* scales;
  const float* factors;    // E × kFactorsPerExpert
  size_t expert_weight_bytes, expert_scale_bytes;
  int K;                   // inputs (multiple of 64)
  const __nv_bfloat16* act;  // gate-up: x [tokens, K]; down: hidden_act [pairs, K]
  int act_row_divisor;       // activation row = pair / divisor (k for gate-up, 1 for down)
  const int32_t* slot_expert;
  const int32_t* slot_begin;
  const int32_t* slot_count;
  const int32_t* sorted_pairs;
  const int32_t* pass_total;  // passes: ≤ pass-cap rows of one expert (moe_route_pairs)
  const int32_t* pass_expert;
  const int32_t* pass_begin;
  const int32_t* pass_rows;
  const float* topk_weights;  // gate-up only
  float swiglu_limit;
  __nv_bfloat16* out;         // gate-up: hidden_act [pairs, I]; down: expert_out [pairs, D]
  int out_cols;               // I or D
  // Down only, for a tensor-parallel rank (moe_fp4_partials): each pair's output before its bf16
  // rounding, f32 [tokens, partial_k + 1, D] with pair t·k+j at row t·(k+1)+j; out is not written.
  float* partials;
  int partial_k;
};

// Where a pair's f32 partial row starts (GemmArgs::partials).
__device__ __forceinline__ float* partial_row(float* partials, int pair, int k, int cols) {
  return partials + size_t(pair + pair / k) * cols;
}

// A MoeFp4Format template argument as the demangler prints it (the kernel names of KernelLaunch).
inline std::string format_template_arg(MoeFp4Format f) { return "(dsv4::MoeFp4Format)" + std::to_string(int(f)); }

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

// Stored scale byte → bf16 folded scale, duplicated in both halves (see backend/moe_fp4_layout.cpp).
template <MoeFp4Format F>
__device__ __forceinline__ uint32_t folded_scale_x2(uint32_t code) {
  uint32_t bits = F == MoeFp4Format::Mxfp4 ? code << 7 : (code << 4) + (224u << 7);
  return bits * 0x10001u;
}

// One word of e2m1 nibbles → the four bf16x2 A registers of one mma K step (layout in moe_fp4.h).
// Each nibble becomes bf16 bits sign<<15 | e2m1[2:0]<<6 = e2m1 · 2^-126; the folded scale restores
// the magnitude, exactly.
__device__ __forceinline__ void dequant_a(uint32_t w, uint32_t s_row_g, uint32_t s_row_g8, uint32_t (&a)[4]) {
  const uint32_t em = 0x01C001C0u, sg = 0x80008000u;
  a[0] = bf16x2_mul(((w << 6) & em) | ((w << 12) & sg), s_row_g);
  a[1] = bf16x2_mul(((w << 2) & em) | ((w << 8) & sg), s_row_g8);
  a[2] = bf16x2_mul(((w >> 2) & em) | ((w << 4) & sg), s_row_g);
  a[3] = bf16x2_mul(((w >> 6) & em) | (w & sg), s_row_g8);
}


// One 16-byte unit slice and its two scale bytes → four MMA K steps into acc. b: this lane's 16
// activations (two 16-byte vectors), zero for token columns past the pass's rows.
template <MoeFp4Format F>
__device__ __forceinline__ void mma_unit(float (&acc)[4], const uint4& wq, uint32_t sc, const uint4& xb0,
                                         const uint4& xb1) {
  const uint32_t s_g = folded_scale_x2<F>(sc & 0xffu), s_g8 = folded_scale_x2<F>(sc >> 8);
  const uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
  const uint32_t b[8] = {xb0.x, xb0.y, xb0.z, xb0.w, xb1.x, xb1.y, xb1.z, xb1.w};
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    uint32_t a[4];
    dequant_a(words[t], s_g, s_g8, a);
    mma_bf16(acc, a, b[2 * t], b[2 * t + 1]);
  }
}

__device__ __forceinline__ float bf16_round(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// Epilogue of one accumulator column: lo / hi = rows g / g+8 of 16-row weight tile `tile`, for pair
// `pair`. fac0 / fac1: the matrix factors (gate / up, or down twice); topk_w: the pair's routing weight.
template <bool kGateUp>
__device__ __forceinline__ void store_fragment(const GemmArgs& p, int tile, int g, int pair, float topk_w,
                                               float fac0, float fac1, float lo, float hi) {
  if (kGateUp) {
    // Rows g / g+8 of the tile are gate / up of intermediate channel 8·tile + g (SPEC §3.7).
    float gate = fminf(bf16_round(lo * fac0), p.swiglu_limit);
    float up = fminf(fmaxf(bf16_round(hi * fac1), -p.swiglu_limit), p.swiglu_limit);
    float h = gate / (1.f + expf(-gate)) * up * topk_w;
    p.out[size_t(pair) * p.out_cols + 8 * tile + g] = __float2bfloat16_rn(h);
  } else if (p.partials) {
    float* o = partial_row(p.partials, pair, p.partial_k, p.out_cols) + 16 * tile + g;
    o[0] = lo * fac0;
    o[8] = hi * fac0;
  } else {
    __nv_bfloat16* o = p.out + size_t(pair) * p.out_cols + 16 * tile + g;
    o[0] = __float2bfloat16_rn(lo * fac0);
    o[8] = __float2bfloat16_rn(hi * fac0);
  }
}

// The streaming decode GEMM (moe_fp4_stream.cu, sm_90 and later). rows: weight rows (2I or D). Its
// shared-memory ring takes what the device offers; moe_fp4_stream_fits() says whether this device
// runs it and both GEMMs of `shape` get at least two stages (sm_120 has 99 KB per block, sm_90
// 227 KB: two stages of 4096 inputs take 88 KB).
bool moe_fp4_stream_fits(const MoeFp4Shape& shape, const DeviceLimits& limits);
void moe_fp4_stream_gemm(MoeFp4Format format, bool gate_up, const GemmArgs& args, int rows, cudaStream_t stream);
// The streaming GEMM's launch for K inputs on such a device (dynamic_smem 0: fewer than two stages fit).
KernelLaunch moe_fp4_stream_launch(MoeFp4Format format, bool gate_up, int K, const DeviceLimits& limits);

// The tiled W4A16 GEMM for many tokens per expert (moe_fp4_tiled.cu; any sm_80+ device). rows: weight
// rows (2I or D); K and rows multiples of 128.
void moe_fp4_tiled_gemm(MoeFp4Format format, bool gate_up, const GemmArgs& args, int rows, int max_slots,
                        cudaStream_t stream);
KernelLaunch moe_fp4_tiled_launch(MoeFp4Format format, bool gate_up);

// The sm_90a W4A8 GEMMs (moe_fp4_w4a8.cu), MXFP4 only.
struct W4a8Args {
  const uint8_t* weights;    // all experts, unit layout
  const uint8_t* index;      // W4A8 table indices, unit-scale layout
  const float* row_scale;    // [E, rows]
  size_t expert_weight_bytes, expert_index_bytes;
  int rows, K;               // weight rows (2I or D, multiple of 128) and inputs (multiple of 128)
  const uint8_t* act;        // e4m3 [activation rows, K]
  const float* act_scale;    // [activation rows, K/128]
  int act_row_divisor;       // activation row = pair / divisor (k for gate-up, 1 for down)
  const int32_t* slot_expert;
  const int32_t* slot_begin;
  const int32_t* slot_count;
  const int32_t* sorted_pairs;
  const float* topk_weights;  // gate-up only
  float swiglu_limit;
  __nv_bfloat16* out;         // gate-up: hidden_act [pairs, I]; down: expert_out [pairs, D]
  int out_cols;
  int max_slots;              // slots that may be active (set by moe_w4a8_gemm)
  float* partials;            // as GemmArgs::partials
  int partial_k;
};
// Whether the current device runs the W4A8 kernels (an sm_90 GPU, and the build has sm_90a code).
bool moe_w4a8_supported();
void moe_w4a8_gemm(bool gate_up, const W4a8Args& args, int max_slots, cudaStream_t stream);
KernelLaunch moe_w4a8_launch(bool gate_up, bool partials = false);  // partials: the down GEMM with f32 outputs

}  // namespace dsv4::cuda::moe_detail
