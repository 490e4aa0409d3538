// CPU reference of the routed-expert MoE with FP4 weights (SPEC.md §3.7, §2.2, §2.4, §5.1, §5.3).
// It is the twin of the CUDA op in backend/cuda/moe_fp4.h: plain loops, f32 accumulation, the same
// rounding points as the reference model. Both activation numerics are covered:
//   - Bf16:  activations enter the GEMMs as bf16 (what the GPU's W4A16 path computes);
//   - Fp8:   activations are quantised to e4m3 per 128 channels with power-of-two scales (§2.2) and
//            each 32-wide (MXFP4) or 16-wide (NVFP4) weight block's partial sum is scaled by both
//            scales (§2.4) — the reference model's own numerics.
#pragma once
#include <cstdint>
#include <vector>

namespace dsv4 {

// On-disk format of the routed experts.
enum class MoeFp4Format : uint8_t {
  Mxfp4,  // e2m1 + ue8m0 scale per 32 inputs (official checkpoint)
  Nvfp4,  // e2m1 + e4m3 scale per 16 inputs + one f32 per-tensor scale (ModelOpt)
};

// Elements per weight scale along the input dimension.
constexpr int moe_fp4_group_size(MoeFp4Format f) { return f == MoeFp4Format::Mxfp4 ? 32 : 16; }

struct MoeFp4Shape {
  MoeFp4Format format = MoeFp4Format::Mxfp4;
  int experts = 0;            // E
  int hidden = 0;             // D (input of w1/w3, output of w2)
  int inter = 0;              // I (output of w1/w3, input of w2)
  float swiglu_limit = 10.f;  // §3.7: up clamped to ±limit, gate ≤ limit
};

// Host views of one expert's tensors exactly as stored on disk (row-major, low nibble = even element).
//   w1, w3: packed [I, D/2], scale [I, D/group];  w2: packed [D, I/2], scale [D, I/group].
//   MXFP4 scales are ue8m0 codes; NVFP4 scales are e4m3 codes and *_scale_2 the f32 weight_scale_2
//   (ignored for MXFP4).
struct MoeFp4ExpertTensors {
  const uint8_t* w1 = nullptr;
  const uint8_t* w1_scale = nullptr;
  const uint8_t* w3 = nullptr;
  const uint8_t* w3_scale = nullptr;
  const uint8_t* w2 = nullptr;
  const uint8_t* w2_scale = nullptr;
  float w1_scale_2 = 1.f, w3_scale_2 = 1.f, w2_scale_2 = 1.f;
};

enum class MoeActivationNumerics : uint8_t { Bf16, Fp8 };

namespace cpu {

// Dequantises one FP4 matrix [rows, cols] to f32: e2m1 · scale (· scale_2 for NVFP4), in that order.
std::vector<float> dequantize_fp4_matrix(MoeFp4Format format, const uint8_t* packed, const uint8_t* scales,
                                         float scale_2, int rows, int cols);

// The input of w2 for each pair p = t·k + j (bf16 bits [tokens·k, inter]: the clamped SwiGLU of the
// gate-up outputs times the routing weight), to check an implementation one GEMM at a time: `out`
// receives it (rows of pairs without an expert are left alone); with `in` the reference reads it from
// there instead of computing it, and runs only w2 and the sum.
struct MoeHiddenTap {
  uint16_t* out = nullptr;
  const uint16_t* in = nullptr;
};

// out[t] = bf( Σ_j f32(y_{ids[t][j]}(x[t]) · …) + f32(shared[t]) ), see SPEC.md §3.7 for y_e.
// x, shared_or_null, out: bf16 bits [tokens, hidden]; topk_ids/topk_weights: [tokens, k].
// Pairs whose expert id is outside [0, experts) contribute nothing.
void moe_fp4_reference(const MoeFp4Shape& shape, const std::vector<MoeFp4ExpertTensors>& experts,
                       const uint16_t* x, int tokens, const int32_t* topk_ids, const float* topk_weights, int k,
                       const uint16_t* shared_or_null, uint16_t* out, MoeActivationNumerics numerics,
                       MoeHiddenTap hidden = {});

// The same experts' w2 outputs per pair before their bf16 rounding (a tensor-parallel rank's
// partial when the experts hold a slice of the intermediate dimension): pair (t, j)'s f32 [hidden]
// goes to out + t·token_stride + j·hidden; pairs without an expert in [0, experts) are left alone.
void moe_fp4_pair_outputs(const MoeFp4Shape& shape, const std::vector<MoeFp4ExpertTensors>& experts, const uint16_t* x,
                          int tokens, const int32_t* topk_ids, const float* topk_weights, int k, float* out,
                          int64_t token_stride, MoeActivationNumerics numerics);

}  // namespace cpu
}  // namespace dsv4
