// Expert GEMMs of the FP4 MoE (SPEC.md §3.7) on tensor cores, W4A16: e2m1 weights are unpacked to
// bf16 in registers with the block scale folded in, multiplied with bf16 activations by
// mma.sync.m16n8k16 (f32 accumulation). Weights sit on the MMA's M side ("swap AB"): at decode an
// expert sees a handful of tokens, which fill the N = 8 side, while its weight rows fill M.
//
// The kernel here (decode: few tokens per expert): a block works on one expert slot (blockIdx.y) and
// four 16-row weight tiles; its 8 warps split K per tile and reduce through shared memory. Every
// weight byte is read once per pass of 8·NT tokens (the launches use NT = 1), as 16-byte loads that
// each fill one lane's A fragments for four MMA K steps. Many tokens per expert (prefill) go to the
// tiled kernel (moe_fp4_tiled.cu: tokens on M, 64 per pass, activations staged in shared memory). The
// streaming decode kernel (weights through a shared-memory ring filled by the bulk copy engine;
// measured slower on the H200, a forced path) is moe_fp4_stream.cu.
// The gate-up kernel's epilogue applies the clamped SwiGLU and the routing weight; the down kernel
// writes each pair's bf16 expert output, which moe_combine() sums per token.
#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "backend/cuda/act_quant_fp8.h"
#include "backend/cuda/moe_fp4.h"
#include "backend/cuda/row_ops.h"
#include "backend/cuda/moe_fp4_kernels.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

using moe_detail::GemmArgs;
using moe_detail::W4a8Args;
using moe_detail::bf16_round;
using moe_detail::dequant_a;
using moe_detail::folded_scale_x2;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

__device__ __forceinline__ uint4 load_stream(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// Epilogue of one accumulator fragment: v[0..1] = rows g, tokens idx0 and idx0+1; v[2..3] = rows g+8.
template <bool kGateUp>
__device__ __forceinline__ void store_outputs(const GemmArgs& p, int expert, int tile, int begin, int count, int idx0,
                                              int g, const float (&v)[4]) {
  const float* fac = p.factors + expert * kFactorsPerExpert;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    int idx = idx0 + c;
    if (idx >= count) continue;
    int pair = p.sorted_pairs[begin + idx];
    if (kGateUp) {
      // Rows g / g+8 of the tile are gate / up of intermediate channel 8·tile + g (SPEC §3.7).
      float gate = fminf(bf16_round(v[c] * fac[kGateFactor]), p.swiglu_limit);
      float up = fminf(fmaxf(bf16_round(v[2 + c] * fac[kUpFactor]), -p.swiglu_limit), p.swiglu_limit);
      float silu = gate / (1.f + expf(-gate));
      float h = silu * up * p.topk_weights[pair];
      p.out[size_t(pair) * p.out_cols + 8 * tile + g] = __float2bfloat16_rn(h);
    } else if (p.partials) {
      float* o = moe_detail::partial_row(p.partials, pair, p.partial_k, p.out_cols) + 16 * tile + g;
      o[0] = v[c] * fac[kDownFactor];
      o[8] = v[2 + c] * fac[kDownFactor];
    } else {
      __nv_bfloat16* o = p.out + size_t(pair) * p.out_cols + 16 * tile + g;
      o[0] = __float2bfloat16_rn(v[c] * fac[kDownFactor]);
      o[8] = __float2bfloat16_rn(v[2 + c] * fac[kDownFactor]);
    }
  }
}

// 8·NT tokens per pass, activations loaded straight into registers.
// NT: n8 tiles (8 tokens each) per pass; UPW: units (64 inputs) each warp loads before computing;
// RT: 16-row tiles per block (its warps split into RT groups, each group splitting K of one tile),
// so that a short K still gives each block kWarps·UPW units (as many bytes) in flight.
template <MoeFp4Format F, int NT, int UPW, int RT, bool kGateUp>
__global__ void __launch_bounds__(kThreads, 2) moe_fp4_gemm_kernel(GemmArgs p) {
  static_assert(kWarps % RT == 0, "whole warp groups");
  constexpr int kGroupWarps = kWarps / RT;
  pdl_wait();  // routing (and, for down, gate-up's output) come from the kernels before
  pdl_launch_dependents();
  const int slot = blockIdx.y;
  const int expert = p.slot_expert[slot];
  if (expert < 0) return;
  const int begin = p.slot_begin[slot], count = p.slot_count[slot];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int wg = warp % kGroupWarps, tile = blockIdx.x * RT + warp / kGroupWarps;
  const int units = p.K / kMoeUnitCols;
  constexpr int kScaleBytes = moe_unit_scale_bytes(F);
  const int scale_offset = F == MoeFp4Format::Nvfp4 ? 2 * lane : 4 * g + 2 * (q >> 1);
  const uint8_t* wbase = p.weights + expert * p.expert_weight_bytes + size_t(tile) * units * kMoeUnitBytes + lane * 16;
  const uint8_t* sbase = p.scales + expert * p.expert_scale_bytes + size_t(tile) * units * kScaleBytes + scale_offset;

  __shared__ float partial[kWarps][NT * 4][32];

  for (int chunk = 0; chunk < count; chunk += 8 * NT) {
    // This lane's activation row (its B column g) in each n8 tile.
    const __nv_bfloat16* act_row[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      int idx = chunk + 8 * j + g;
      act_row[j] = idx < count ? p.act + size_t(p.sorted_pairs[begin + idx] / p.act_row_divisor) * p.K + 16 * q : nullptr;
    }
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

    for (int u0 = 0; u0 < units; u0 += kGroupWarps * UPW) {
      uint4 wq[UPW];
      uint32_t sc[UPW];
#pragma unroll
      for (int i = 0; i < UPW; ++i) {
        int u = u0 + i * kGroupWarps + wg;
        wq[i] = u < units ? load_stream(wbase + size_t(u) * kMoeUnitBytes) : make_uint4(0, 0, 0, 0);
        sc[i] = u < units ? __ldg(reinterpret_cast<const unsigned short*>(sbase + size_t(u) * kScaleBytes)) : 0u;
      }
      uint4 xb[UPW][NT][2];
#pragma unroll
      for (int i = 0; i < UPW; ++i) {
        int u = u0 + i * kGroupWarps + wg;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          if (u < units && act_row[j]) {
            const uint4* src = reinterpret_cast<const uint4*>(act_row[j] + u * kMoeUnitCols);
            xb[i][j][0] = __ldg(src);
            xb[i][j][1] = __ldg(src + 1);
          } else {
            xb[i][j][0] = xb[i][j][1] = make_uint4(0, 0, 0, 0);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < UPW; ++i) {
        const uint32_t s_g = folded_scale_x2<F>(sc[i] & 0xffu), s_g8 = folded_scale_x2<F>(sc[i] >> 8);
        const uint32_t words[4] = {wq[i].x, wq[i].y, wq[i].z, wq[i].w};
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          uint32_t a[4];
          dequant_a(words[t], s_g, s_g8, a);
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const uint4& v = xb[i][j][t >> 1];
            uint32_t b0 = (t & 1) ? v.z : v.x, b1 = (t & 1) ? v.w : v.y;
            mma_bf16(acc[j], a, b0, b1);
          }
        }
      }
    }

    // Reduce each group's K slices; warp wg of the group finishes n8 tiles wg, wg + kGroupWarps, ….
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) partial[warp][j * 4 + c][lane] = acc[j][c];
    __syncthreads();
    for (int j = wg; j < NT; j += kGroupWarps) {
      float v[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < kGroupWarps; ++w) s += partial[warp - wg + w][j * 4 + c][lane];
        v[c] = s;
      }
      store_outputs<kGateUp>(p, expert, tile, begin, count, chunk + 8 * j + 2 * q, g, v);
    }
    __syncthreads();
  }
}

GemmArgs common_args(const MoeFp4Weights& w, const float* topk_weights, MoeWorkspace& ws) {
  GemmArgs a{};
  a.factors = w.factors();
  a.slot_expert = ws.slot_expert.get();
  a.slot_begin = ws.slot_begin.get();
  a.slot_count = ws.slot_count.get();
  a.sorted_pairs = ws.sorted_pairs.get();
  a.pass_total = ws.pass_total.get();
  a.pass_expert = ws.pass_expert.get();
  a.pass_begin = ws.pass_begin.get();
  a.pass_rows = ws.pass_rows.get();
  a.topk_weights = topk_weights;
  a.swiglu_limit = w.shape().swiglu_limit;
  return a;
}

GemmArgs gate_up_args(const MoeFp4Weights& w, const uint16_t* x, const float* topk_weights, int k, MoeWorkspace& ws) {
  const int D = w.shape().hidden, I = w.shape().inter;
  GemmArgs a = common_args(w, topk_weights, ws);
  a.weights = w.gate_up();
  a.scales = w.gate_up_scales();
  a.expert_weight_bytes = size_t(2 * I) * D / 2;
  a.expert_scale_bytes = size_t(2 * I / kMoeUnitRows) * (D / kMoeUnitCols) * moe_unit_scale_bytes(w.shape().format);
  a.K = D;
  a.act = reinterpret_cast<const __nv_bfloat16*>(x);
  a.act_row_divisor = k;
  a.out = reinterpret_cast<__nv_bfloat16*>(ws.hidden_act.get());
  a.out_cols = I;
  return a;
}

GemmArgs down_args(const MoeFp4Weights& w, const float* topk_weights, MoeWorkspace& ws) {
  const int D = w.shape().hidden, I = w.shape().inter;
  GemmArgs a = common_args(w, topk_weights, ws);
  a.weights = w.down();
  a.scales = w.down_scales();
  a.expert_weight_bytes = size_t(D) * I / 2;
  a.expert_scale_bytes = size_t(D / kMoeUnitRows) * (I / kMoeUnitCols) * moe_unit_scale_bytes(w.shape().format);
  a.K = I;
  a.act = reinterpret_cast<const __nv_bfloat16*>(ws.hidden_act.get());
  a.act_row_divisor = 1;
  a.out = reinterpret_cast<__nv_bfloat16*>(ws.expert_out.get());
  a.out_cols = D;
  return a;
}

W4a8Args w4a8_args(const MoeFp4Weights& w, bool gate_up, const float* topk_weights, int k, MoeWorkspace& ws) {
  const int D = w.shape().hidden, I = w.shape().inter;
  const int sbytes = moe_unit_scale_bytes(MoeFp4Format::Mxfp4);
  W4a8Args a{};
  a.weights = gate_up ? w.gate_up() : w.down();
  a.index = gate_up ? w.w4a8_gate_up_index() : w.w4a8_down_index();
  a.row_scale = gate_up ? w.w4a8_gate_up_row_scale() : w.w4a8_down_row_scale();
  a.rows = gate_up ? 2 * I : D;
  a.K = gate_up ? D : I;
  a.expert_weight_bytes = size_t(a.rows) * a.K / 2;
  a.expert_index_bytes = size_t(a.rows / kMoeUnitRows) * (a.K / kMoeUnitCols) * sbytes;
  a.act = ws.act_fp8.get();
  a.act_scale = ws.act_scale.get();
  a.act_row_divisor = gate_up ? k : 1;
  a.slot_expert = ws.slot_expert.get();
  a.slot_begin = ws.slot_begin.get();
  a.slot_count = ws.slot_count.get();
  a.sorted_pairs = ws.sorted_pairs.get();
  a.topk_weights = topk_weights;
  a.swiglu_limit = w.shape().swiglu_limit;
  a.out = reinterpret_cast<__nv_bfloat16*>(gate_up ? ws.hidden_act.get() : ws.expert_out.get());
  a.out_cols = gate_up ? I : D;
  return a;
}

// W4A8: quantise x, gate-up, quantise the SwiGLU output (every pair's row; rows of pairs with no
// expert are never read), down.
void run_w4a8(const MoeFp4Weights& w, const uint16_t* x, int tokens, const float* topk_weights, int k,
              float* partials, MoeWorkspace& ws, cudaStream_t stream) {
  const int D = w.shape().hidden, I = w.shape().inter;
  const int max_slots = std::min(w.shape().experts, tokens * k);
  // The kernel addresses activation rows with 32-bit offsets (row · K).
  if (int64_t(tokens) * D >= (int64_t(1) << 32) || int64_t(tokens) * k * I >= (int64_t(1) << 32))
    fail("moe_fp4_forward: W4A8 with {} tokens × k {} exceeds 2^32 activation bytes; split the batch", tokens, k);
  act_quant_fp8(x, tokens, D, ws.act_fp8.get(), ws.act_scale.get(), stream);
  moe_detail::moe_w4a8_gemm(true, w4a8_args(w, true, topk_weights, k, ws), max_slots, stream);
  act_quant_fp8(ws.hidden_act.get(), tokens * k, I, ws.act_fp8.get(), ws.act_scale.get(), stream);
  W4a8Args down = w4a8_args(w, false, topk_weights, k, ws);
  down.partials = partials;
  down.partial_k = k;
  moe_detail::moe_w4a8_gemm(false, down, max_slots, stream);
}

template <MoeFp4Format F>
void run_path(MoeFp4Path path, const MoeFp4Weights& w, const uint16_t* x, const uint16_t* x_fp8, int tokens,
              const float* topk_weights, int k, float* partials, MoeWorkspace& ws, cudaStream_t stream,
              MoeActivationNumerics numerics) {
  const int D = w.shape().hidden, I = w.shape().inter;
  const int max_slots = std::min(w.shape().experts, tokens * k);
  const bool fp8 = numerics == MoeActivationNumerics::Fp8;
  if (fp8 && x_fp8) {
    x = x_fp8;  // the caller rounded it
  } else if (fp8) {  // x on the FP8 grid, in expert_out (free until the down GEMM writes it)
    fp8_simulate_activations(x, ws.expert_out.get(), tokens, D, stream);
    x = ws.expert_out.get();
  }
  // The SwiGLU output on the FP8 grid before the down GEMM (every pair's row; unused rows are never read).
  auto between = [&] {
    if (fp8) fp8_simulate_activations(ws.hidden_act.get(), int64_t(tokens) * k, I, stream);
  };
  const GemmArgs gu = gate_up_args(w, x, topk_weights, k, ws);
  GemmArgs dn = down_args(w, topk_weights, ws);
  dn.partials = partials;
  dn.partial_k = k;
  if (path == MoeFp4Path::W4A16Stream) {
    moe_detail::moe_fp4_stream_gemm(F, true, gu, 2 * I, stream);
    between();
    moe_detail::moe_fp4_stream_gemm(F, false, dn, D, stream);
    return;
  }
  // Launched as programmatic dependents (launch latency hidden behind the kernel before).
  if (path == MoeFp4Path::W4A16Decode) {
    // One block = four 16-row tiles of one expert, two warps per tile splitting K: 32 units (16 KB)
    // per warp for gate-up (K = D = 4096), 16 units for down (K = I = 2048). Longer runs per warp and
    // fewer warps per K reduction measured 8–16% faster than one tile per block with 8 warps × 8
    // units (docs/perf/moe_fp4.md, fifth series).
    static_assert(kMoeUnitRows * 4 <= 128, "2I and D (multiples of 128) hold a multiple of four row tiles");
    launch_programmatic(moe_fp4_gemm_kernel<F, 1, 32, 4, true>, dim3(2 * I / kMoeUnitRows / 4, max_slots),
                        dim3(kThreads), 0, stream, gu);
    between();
    launch_programmatic(moe_fp4_gemm_kernel<F, 1, 16, 4, false>, dim3(D / kMoeUnitRows / 4, max_slots),
                        dim3(kThreads), 0, stream, dn);
    return;
  }
  moe_detail::moe_fp4_tiled_gemm(F, true, gu, 2 * I, max_slots, stream);
  between();
  moe_detail::moe_fp4_tiled_gemm(F, false, dn, D, max_slots, stream);
}

}  // namespace

// The dispatcher, in one place (crossovers measured on the H200, docs/perf/moe_fp4.md). With few pairs
// per expert (the decode kernel reads an expert's weights once per 8 of its tokens): the W4A16 decode path
// (the shared-memory streaming kernel, W4A16Stream, measured slower at every decode size, runs only
// when forced). On sm_90 with MXFP4 experts the W4A8 wgmma path takes over above 16 pairs per expert
// (at 12 the decode path is still faster); elsewhere (sm_120, NVFP4) the tiled W4A16 kernel, which
// uses each unpacked weight for 64 tokens, takes over above 20 (NVFP4 on the H200: decode 5% faster
// at 18 pairs per expert, the tiled kernel 11% faster at 24; sm_120 not measured).
MoeFp4Path moe_fp4_select_path(const MoeFp4Shape& shape, int tokens, int k, const DeviceLimits& limits) {
  const int64_t pairs = int64_t(tokens) * k, experts = shape.experts;
  const bool w4a8 = moe_fp4_path_available(MoeFp4Path::W4A8, shape, limits);
  if (w4a8 && pairs > 16 * experts) return MoeFp4Path::W4A8;
  if (w4a8 || pairs <= 20 * experts || !moe_fp4_path_available(MoeFp4Path::W4A16Batched, shape, limits))
    return MoeFp4Path::W4A16Decode;
  return MoeFp4Path::W4A16Batched;
}

// By capability: W4A8 only on an sm_90 GPU (that runs the build's sm_90a code), the stream kernel on
// sm_90+ where its ring gets two stages; the W4A16 decode and tiled kernels fit every sm_80+ GPU
// (tiled: 51 KB of shared memory).
bool moe_fp4_path_available(MoeFp4Path path, const MoeFp4Shape& shape, const DeviceLimits& limits) {
  if (path == MoeFp4Path::W4A8) return shape.format == MoeFp4Format::Mxfp4 && limits.is_sm90() && limits.sm90a_code;
  if (path == MoeFp4Path::W4A16Stream) return moe_detail::moe_fp4_stream_fits(shape, limits);
  if (path == MoeFp4Path::W4A16Batched)
    return moe_detail::moe_fp4_tiled_launch(shape.format, true).dynamic_smem <= limits.smem_per_block_optin;
  return true;
}

MoeFp4Path moe_fp4_select_path(const MoeFp4Shape& shape, int tokens, int k) {
  return moe_fp4_select_path(shape, tokens, k, current_device_limits());
}

bool moe_fp4_path_available(MoeFp4Path path, const MoeFp4Shape& shape) {
  // W4A8 also asks its own kernels (the probe of current_device_limits() is another function).
  return moe_fp4_path_available(path, shape, current_device_limits()) &&
         (path != MoeFp4Path::W4A8 || moe_detail::moe_w4a8_supported());
}

std::vector<KernelLaunch> moe_fp4_kernel_launches(const MoeFp4Shape& shape, const DeviceLimits& limits) {
  const MoeFp4Format f = shape.format;
  const std::string fa = moe_detail::format_template_arg(f);
  // The decode kernel's two instances (run_path): <F, NT 1, UPW 32 / 16, RT 4, gate-up / down>.
  std::vector<KernelLaunch> out = {{"moe_fp4_gemm_kernel<" + fa + ", 1, 32, 4, true>", kThreads, 0},
                                   {"moe_fp4_gemm_kernel<" + fa + ", 1, 16, 4, false>", kThreads, 0}};
  if (moe_fp4_path_available(MoeFp4Path::W4A16Batched, shape, limits))
    for (bool gate_up : {true, false}) out.push_back(moe_detail::moe_fp4_tiled_launch(f, gate_up));
  if (moe_fp4_path_available(MoeFp4Path::W4A16Stream, shape, limits)) {
    out.push_back(moe_detail::moe_fp4_stream_launch(f, true, shape.hidden, limits));
    out.push_back(moe_detail::moe_fp4_stream_launch(f, false, shape.inter, limits));
  }
  if (moe_fp4_path_available(MoeFp4Path::W4A8, shape, limits))
    for (bool gate_up : {true, false}) out.push_back(moe_detail::moe_w4a8_launch(gate_up));
  if (moe_fp4_path_available(MoeFp4Path::W4A8, shape, limits)) out.push_back(moe_detail::moe_w4a8_launch(false, true));
  for (const KernelLaunch& k : moe_routing_kernel_launches()) out.push_back(k);
  return out;
}

const char* moe_fp4_path_name(MoeFp4Path path) {
  switch (path) {
    case MoeFp4Path::W4A16Stream: return "W4A16 stream";
    case MoeFp4Path::W4A16Decode: return "W4A16 decode";
    case MoeFp4Path::W4A16Batched: return "W4A16 batched";
    case MoeFp4Path::W4A8: return "W4A8 wgmma";
  }
  return "?";
}

void moe_fp4_experts(MoeFp4Path path, const MoeFp4Weights& w, const uint16_t* x, const uint16_t* x_fp8, int tokens,
                 const int32_t* topk_ids, const float* topk_weights, int k, float* partials, MoeWorkspace& ws,
                 cudaStream_t stream, MoeActivationNumerics numerics, bool pairs_grouped) {
  const MoeFp4Shape& s = w.shape();
  if (tokens > ws.max_tokens() || k != ws.k())
    fail("moe_fp4_forward: {} tokens × k {} exceed the workspace ({} tokens × k {})", tokens, k, ws.max_tokens(), ws.k());
  if (!moe_fp4_path_available(path, s))
    fail("moe_fp4_forward: the {} path cannot run here (W4A8: MXFP4 experts on an sm_90 GPU with sm_90a code; "
         "stream: an sm_90+ GPU with shared memory for two ring stages)",
         moe_fp4_path_name(path));
  if (!pairs_grouped) moe_route_pairs(topk_ids, tokens, k, s.experts, path == MoeFp4Path::W4A16Stream, ws, stream);
  if (path == MoeFp4Path::W4A8) {
    if (ws.act_fp8.size() == 0 || !w.has_w4a8()) fail("moe_fp4_forward: W4A8 needs an MXFP4 layer and workspace");
    run_w4a8(w, x, tokens, topk_weights, k, partials, ws, stream);
  } else if (s.format == MoeFp4Format::Mxfp4) {
    run_path<MoeFp4Format::Mxfp4>(path, w, x, x_fp8, tokens, topk_weights, k, partials, ws, stream, numerics);
  } else {
    run_path<MoeFp4Format::Nvfp4>(path, w, x, x_fp8, tokens, topk_weights, k, partials, ws, stream, numerics);
  }
}

void moe_fp4_forward_path(MoeFp4Path path, const MoeFp4Weights& w, const uint16_t* x, int tokens,
                          const int32_t* topk_ids, const float* topk_weights, int k, const uint16_t* shared_or_null,
                          uint16_t* out, MoeWorkspace& ws, cudaStream_t stream, MoeActivationNumerics numerics,
                          const uint16_t* x_fp8) {
  if (tokens <= 0) return;
  moe_fp4_experts(path, w, x, x_fp8, tokens, topk_ids, topk_weights, k, nullptr, ws, stream, numerics);
  moe_combine(ws.expert_out.get(), topk_ids, tokens, k, w.shape().experts, w.shape().hidden, shared_or_null, out, stream);
}

void moe_fp4_partials(MoeFp4Path path, const MoeFp4Weights& w, const uint16_t* x, int tokens, const int32_t* topk_ids,
                      const float* topk_weights, int k, const float* shared_or_null, float* partials, MoeWorkspace& ws,
                      cudaStream_t stream, MoeActivationNumerics numerics, const uint16_t* x_fp8) {
  if (tokens <= 0) return;
  moe_fp4_experts(path, w, x, x_fp8, tokens, topk_ids, topk_weights, k, partials, ws, stream, numerics);
  moe_partials_finish(topk_ids, tokens, k, w.shape().experts, w.shape().hidden, shared_or_null, partials, stream);
}

void moe_fp4_forward(const MoeFp4Weights& w, const uint16_t* x, int tokens, const int32_t* topk_ids,
                     const float* topk_weights, int k, const uint16_t* shared_or_null, uint16_t* out,
                     MoeWorkspace& ws, cudaStream_t stream, MoeActivationNumerics numerics) {
  moe_fp4_forward_path(moe_fp4_select_path(w.shape(), tokens, k), w, x, tokens, topk_ids, topk_weights, k,
                       shared_or_null, out, ws, stream, numerics);
}

}  // namespace dsv4::cuda
