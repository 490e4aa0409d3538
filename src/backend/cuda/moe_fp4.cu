// Expert GEMMs of the FP4 MoE (SPEC.md §3.7) on tensor cores, W4A16: e2m1 weights are unpacked to
// bf16 in registers with the block scale folded in, multiplied with bf16 activations by
// mma.sync.m16n8k16 (f32 accumulation). Weights sit on the MMA's M side ("swap AB"): at decode an
// expert sees a handful of tokens, which fill the N = 8 side, while its weight rows fill M.
//
// A block works on one expert slot (blockIdx.y) and 16-row weight tiles; its 8 warps split K and reduce
// through shared memory. Every weight byte is read once per pass over the expert's tokens (8 per pass
// in the decode kernel, 32 in the batched one), as 16-byte loads that each fill one lane's A fragments
// for four MMA K steps.
// The gate-up kernel's epilogue applies the clamped SwiGLU and the routing weight; the down kernel
// writes each pair's bf16 expert output, which moe_combine() sums per token.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/moe_fp4.h"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

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
  const float* topk_weights;  // gate-up only
  float swiglu_limit;
  __nv_bfloat16* out;         // gate-up: hidden_act [pairs, I]; down: expert_out [pairs, D]
  int out_cols;               // I or D
};

__device__ __forceinline__ uint4 load_stream(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

// Stored scale byte → bf16 folded scale, duplicated in both halves (see moe_fp4_repack.cpp).
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

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float bf16_round(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }


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
    } else {
      __nv_bfloat16* o = p.out + size_t(pair) * p.out_cols + 16 * tile + g;
      o[0] = __float2bfloat16_rn(v[c] * fac[kDownFactor]);
      o[8] = __float2bfloat16_rn(v[2 + c] * fac[kDownFactor]);
    }
  }
}

// Batched variant: 8·NT tokens per pass, activations loaded straight into registers.
// NT: n8 tiles (8 tokens each) per pass; UPW: units (64 inputs) each warp loads before computing.
template <MoeFp4Format F, int NT, int UPW, bool kGateUp>
__global__ void __launch_bounds__(kThreads, 2) moe_fp4_gemm_kernel(GemmArgs p) {
  const int slot = blockIdx.y;
  const int expert = p.slot_expert[slot];
  if (expert < 0) return;
  const int begin = p.slot_begin[slot], count = p.slot_count[slot];
  const int tile = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
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

    for (int u0 = 0; u0 < units; u0 += kWarps * UPW) {
      uint4 wq[UPW];
      uint32_t sc[UPW];
#pragma unroll
      for (int i = 0; i < UPW; ++i) {
        int u = u0 + i * kWarps + warp;
        wq[i] = u < units ? load_stream(wbase + size_t(u) * kMoeUnitBytes) : make_uint4(0, 0, 0, 0);
        sc[i] = u < units ? __ldg(reinterpret_cast<const unsigned short*>(sbase + size_t(u) * kScaleBytes)) : 0u;
      }
      uint4 xb[UPW][NT][2];
#pragma unroll
      for (int i = 0; i < UPW; ++i) {
        int u = u0 + i * kWarps + warp;
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

    // Reduce the 8 warps' K slices; warp j finishes n8 tile j.
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) partial[warp][j * 4 + c][lane] = acc[j][c];
    __syncthreads();
    for (int j = warp; j < NT; j += kWarps) {
      float v[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) s += partial[w][j * 4 + c][lane];
        v[c] = s;
      }
      store_outputs<kGateUp>(p, expert, tile, begin, count, chunk + 8 * j + 2 * q, g, v);
    }
    __syncthreads();
  }
}

// Decode variant: up to 8 tokens per pass (one n8 tile). A block owns one expert slot and a run of
// row-tile groups (kWarps / kWarpsPerTile tiles side by side, kWarpsPerTile warps splitting K for each).
// Each warp walks its (tile, K pass) steps with a two-deep register pipeline: the next step's weight
// loads are in flight while the current step computes, reduces and stores, so memory stays busy
// across the per-tile barriers. The pass's activation rows, pair ids and routing weights are staged
// in shared memory once per block.
template <MoeFp4Format F, int kWarpsPerTile, int UPW, bool kGateUp>
__global__ void __launch_bounds__(kThreads, 2)
    moe_fp4_decode_kernel(GemmArgs p, int pass_rows, int tile_groups, int groups_per_block) {
  constexpr int kTilesPerGroup = kWarps / kWarpsPerTile;
  constexpr int kScaleBytes = moe_unit_scale_bytes(F);
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ float partial[kWarps][4][32];
  __shared__ int pass_pair[8];
  __shared__ float pass_weight[8];
  const int slot = blockIdx.y;
  const int expert = p.slot_expert[slot];
  if (expert < 0) return;
  const int group0 = blockIdx.x * groups_per_block;
  const int groups = min(groups_per_block, tile_groups - group0);
  if (groups <= 0) return;
  const int begin = p.slot_begin[slot], count = p.slot_count[slot];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int kslice = warp % kWarpsPerTile, tile_in_group = warp / kWarpsPerTile;
  const int units = p.K / kMoeUnitCols;
  constexpr int kUnitsPerPass = kWarpsPerTile * UPW;
  const int kpasses = (units + kUnitsPerPass - 1) / kUnitsPerPass;
  const int steps = groups * kpasses;
  const int scale_offset = F == MoeFp4Format::Nvfp4 ? 2 * lane : 4 * g + 2 * (q >> 1);
  const uint8_t* wexpert = p.weights + expert * p.expert_weight_bytes + lane * 16;
  const uint8_t* sexpert = p.scales + expert * p.expert_scale_bytes + scale_offset;
  const float* fac = p.factors + expert * kFactorsPerExpert;
  const float fac0 = kGateUp ? fac[kGateFactor] : fac[kDownFactor], fac1 = kGateUp ? fac[kUpFactor] : fac0;
  const int xstride = p.K + 8;  // bf16 elements; +16 bytes staggers rows across banks
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem_raw);

  auto tile_of = [&](int step) { return (group0 + step / kpasses) * kTilesPerGroup + tile_in_group; };
  auto load_step = [&](int step, uint4 (&wq)[UPW], uint32_t (&sc)[UPW]) {
    const size_t tile_unit0 = size_t(tile_of(step)) * units;
    const int u0 = (step % kpasses) * kUnitsPerPass + kslice;
#pragma unroll
    for (int i = 0; i < UPW; ++i) {
      int u = u0 + i * kWarpsPerTile;
      bool ok = u < units;
      wq[i] = ok ? load_stream(wexpert + (tile_unit0 + u) * kMoeUnitBytes) : make_uint4(0, 0, 0, 0);
      sc[i] = ok ? __ldg(reinterpret_cast<const unsigned short*>(sexpert + (tile_unit0 + u) * kScaleBytes)) : 0u;
    }
  };

  for (int chunk = 0; chunk < count; chunk += pass_rows) {
    const int rows = min(pass_rows, count - chunk);
    uint4 wq[UPW], wq_next[UPW];
    uint32_t sc[UPW], sc_next[UPW];
    load_step(0, wq, sc);
    if (threadIdx.x < rows) {
      int pair = p.sorted_pairs[begin + chunk + threadIdx.x];
      pass_pair[threadIdx.x] = pair;
      pass_weight[threadIdx.x] = kGateUp ? p.topk_weights[pair] : 0.f;
    }
    {
      const int vec_per_row = p.K / 8;
      for (int v = threadIdx.x; v < rows * vec_per_row; v += kThreads) {
        int r = v / vec_per_row, c = v % vec_per_row;
        int pair = p.sorted_pairs[begin + chunk + r];
        const uint4* src = reinterpret_cast<const uint4*>(p.act + size_t(pair / p.act_row_divisor) * p.K) + c;
        *reinterpret_cast<uint4*>(xs + r * xstride + c * 8) = __ldg(src);
      }
    }
    __syncthreads();
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int step = 0; step < steps; ++step) {
      if (step + 1 < steps) load_step(step + 1, wq_next, sc_next);
      const int u0 = (step % kpasses) * kUnitsPerPass + kslice;
#pragma unroll
      for (int i = 0; i < UPW; ++i) {
        int u = u0 + i * kWarpsPerTile;
        uint4 xb0 = make_uint4(0, 0, 0, 0), xb1 = xb0;
        if (g < rows && u < units) {
          const uint4* src = reinterpret_cast<const uint4*>(xs + g * xstride + u * kMoeUnitCols + 16 * q);
          xb0 = src[0];
          xb1 = src[1];
        }
        const uint32_t s_g = folded_scale_x2<F>(sc[i] & 0xffu), s_g8 = folded_scale_x2<F>(sc[i] >> 8);
        const uint32_t words[4] = {wq[i].x, wq[i].y, wq[i].z, wq[i].w};
        const uint32_t b[8] = {xb0.x, xb0.y, xb0.z, xb0.w, xb1.x, xb1.y, xb1.z, xb1.w};
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          uint32_t a[4];
          dequant_a(words[t], s_g, s_g8, a);
          mma_bf16(acc, a, b[2 * t], b[2 * t + 1]);
        }
      }
      if ((step + 1) % kpasses == 0) {
        // Tile done: reduce its K slices; the tile's first warp applies the epilogue.
#pragma unroll
        for (int c = 0; c < 4; ++c) partial[warp][c][lane] = acc[c];
        __syncthreads();
        if (kslice == 0) {
          float v[4];
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            float sum = 0.f;
#pragma unroll
            for (int w = 0; w < kWarpsPerTile; ++w) sum += partial[warp + w][c][lane];
            v[c] = sum;
          }
          const int tile = tile_of(step);
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int r = 2 * q + c;
            if (r >= rows) continue;
            const int pair = pass_pair[r];
            if (kGateUp) {
              // Rows g / g+8 of the tile are gate / up of intermediate channel 8·tile + g (SPEC §3.7).
              float gate = fminf(bf16_round(v[c] * fac0), p.swiglu_limit);
              float up = fminf(fmaxf(bf16_round(v[2 + c] * fac1), -p.swiglu_limit), p.swiglu_limit);
              float h = gate / (1.f + expf(-gate)) * up * pass_weight[r];
              p.out[size_t(pair) * p.out_cols + 8 * tile + g] = __float2bfloat16_rn(h);
            } else {
              __nv_bfloat16* o = p.out + size_t(pair) * p.out_cols + 16 * tile + g;
              o[0] = __float2bfloat16_rn(v[c] * fac0);
              o[8] = __float2bfloat16_rn(v[2 + c] * fac0);
            }
          }
        }
        __syncthreads();
        acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
      }
#pragma unroll
      for (int i = 0; i < UPW; ++i) wq[i] = wq_next[i], sc[i] = sc_next[i];
    }
  }
}

GemmArgs common_args(const MoeFp4Weights& w, const float* topk_weights, MoeWorkspace& ws) {
  GemmArgs a{};
  a.factors = w.factors();
  a.slot_expert = ws.slot_expert.get();
  a.slot_begin = ws.slot_begin.get();
  a.slot_count = ws.slot_count.get();
  a.sorted_pairs = ws.sorted_pairs.get();
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

int multiprocessor_count() {
  static int count = [] {
    int device = 0, n = 0;
    DSV4_CUDA_CHECK(cudaGetDevice(&device));
    DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n;
  }();
  return count;
}

template <MoeFp4Format F, int kWarpsPerTile, int UPW, bool kGateUp>
void launch_decode(const GemmArgs& a, int rows, int tokens, int max_slots, cudaStream_t stream) {
  auto kernel = moe_fp4_decode_kernel<F, kWarpsPerTile, UPW, kGateUp>;
  const int pass_rows = std::min(8, tokens);
  const size_t smem = size_t(pass_rows) * (a.K + 8) * 2;
  if (smem > 48 * 1024) {
    static size_t raised = 0;  // per instantiation; the attribute is a property of the function
    if (smem > raised) {
      DSV4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      raised = smem;
    }
  }
  // Enough tile groups per block that the grid is about one wave of resident blocks (2 per SM) when
  // few experts are active, but at most 8, so that many active experts still spread over all SMs.
  const int tile_groups = rows / kMoeUnitRows / (kWarps / kWarpsPerTile);
  const int64_t resident = int64_t(2) * multiprocessor_count();
  const int per_block = int(std::clamp<int64_t>((int64_t(tile_groups) * max_slots + resident - 1) / resident, 1, 8));
  dim3 grid((tile_groups + per_block - 1) / per_block, max_slots);
  kernel<<<grid, kThreads, smem, stream>>>(a, pass_rows, tile_groups, per_block);
  DSV4_CUDA_CHECK_LAUNCH();
}

template <MoeFp4Format F>
void run_path(MoeFp4Path path, const MoeFp4Weights& w, const uint16_t* x, int tokens, const float* topk_weights,
              int k, MoeWorkspace& ws, cudaStream_t stream) {
  const int D = w.shape().hidden, I = w.shape().inter;
  const int max_slots = std::min(w.shape().experts, tokens * k);
  const GemmArgs gu = gate_up_args(w, x, topk_weights, k, ws), dn = down_args(w, topk_weights, ws);
  if (path == MoeFp4Path::W4A16Decode) {
    // 8 warps split K of one 16-row tile: 8 units (4 KB) per warp and step for gate-up (K = D = 4096),
    // 4 units for down (K = I = 2048), which keeps the two-deep pipeline within 128 registers.
    launch_decode<F, 8, 8, true>(gu, 2 * I, tokens, max_slots, stream);
    launch_decode<F, 8, 4, false>(dn, D, tokens, max_slots, stream);
    return;
  }
  moe_fp4_gemm_kernel<F, 4, 2, true><<<dim3(2 * I / kMoeUnitRows, max_slots), kThreads, 0, stream>>>(gu);
  DSV4_CUDA_CHECK_LAUNCH();
  moe_fp4_gemm_kernel<F, 4, 2, false><<<dim3(D / kMoeUnitRows, max_slots), kThreads, 0, stream>>>(dn);
  DSV4_CUDA_CHECK_LAUNCH();
}

}  // namespace

// The dispatcher, in one place. W4A16 serves every architecture and size: with at most ~8 pairs per
// expert on average every weight byte is read once per forward (decode path); above that the batched
// variant amortises each dequantised weight over 32 tokens. (The sm_90a FP8-wgmma W4A8 path for large
// token counts is not built yet; when it is, it takes tokens ≥ its crossover on sm_90.)
MoeFp4Path moe_fp4_select_path(const MoeFp4Shape& shape, int tokens, int k) {
  return int64_t(tokens) * k <= int64_t(8) * shape.experts ? MoeFp4Path::W4A16Decode : MoeFp4Path::W4A16Batched;
}

const char* moe_fp4_path_name(MoeFp4Path path) {
  switch (path) {
    case MoeFp4Path::W4A16Decode: return "W4A16 decode";
    case MoeFp4Path::W4A16Batched: return "W4A16 batched";
  }
  return "?";
}

void moe_fp4_forward_path(MoeFp4Path path, const MoeFp4Weights& w, const uint16_t* x, int tokens,
                          const int32_t* topk_ids, const float* topk_weights, int k, const uint16_t* shared_or_null,
                          uint16_t* out, MoeWorkspace& ws, cudaStream_t stream) {
  const MoeFp4Shape& s = w.shape();
  if (tokens <= 0) return;
  if (tokens > ws.max_tokens() || k != ws.k())
    fail("moe_fp4_forward: {} tokens × k {} exceed the workspace ({} tokens × k {})", tokens, k, ws.max_tokens(), ws.k());
  moe_route_pairs(topk_ids, tokens, k, s.experts, ws, stream);
  if (s.format == MoeFp4Format::Mxfp4) run_path<MoeFp4Format::Mxfp4>(path, w, x, tokens, topk_weights, k, ws, stream);
  else run_path<MoeFp4Format::Nvfp4>(path, w, x, tokens, topk_weights, k, ws, stream);
  moe_combine(ws.expert_out.get(), topk_ids, tokens, k, s.experts, s.hidden, shared_or_null, out, stream);
}

void moe_fp4_forward(const MoeFp4Weights& w, const uint16_t* x, int tokens, const int32_t* topk_ids,
                     const float* topk_weights, int k, const uint16_t* shared_or_null, uint16_t* out,
                     MoeWorkspace& ws, cudaStream_t stream) {
  moe_fp4_forward_path(moe_fp4_select_path(w.shape(), tokens, k), w, x, tokens, topk_ids, topk_weights, k,
                       shared_or_null, out, ws, stream);
}

}  // namespace dsv4::cuda
