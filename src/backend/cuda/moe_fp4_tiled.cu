// The W4A16 expert GEMMs for many tokens per expert (prefill): tokens on the MMA's M side, weights on
// N. A block takes 256 weight rows (8 warps × two 16-row tiles) of one expert slot and walks its
// tokens 64 at a time; the 64 tokens' activations go through a 3-stage cp.async ring in shared
// memory, 128 inputs per stage, shared by the 8 warps. Each warp unpacks its weight units (e2m1 →
// bf16 with the block scale folded in, as the decode kernels do) once per 64 tokens, so an unpacked
// register feeds 4 MMAs (the 4 token tiles) instead of 1.
//
// Register layouts: the unit layout (moe_fp4.h) gives lane (g, q) the A fragments of weight rows g
// and g+8 for the unit's four k16 steps, inputs 16q … 16q+15 of the unit in the order the MMA's
// k slots expect. Read as B operands, {a0, a2} are the fragment of rows 0–7 and {a1, a3} that of rows
// 8–15. The activation A fragments need, for token row r and step t, inputs 16q + 4t … 16q + 4t + 3:
// one 16-byte shared load gives those of two steps. Rows are padded to 272 bytes so that the 2 rows ×
// 4 lanes of a quarter warp hit distinct banks.
#include <cuda_bf16.h>

#include "backend/cuda/moe_fp4_kernels.cuh"

namespace dsv4::cuda::moe_detail {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kTilesPerWarp = 2;                                 // 16-row weight tiles per warp
constexpr int kBlockRows = kWarps * kTilesPerWarp * kMoeUnitRows;  // 256
constexpr int kTokens = 64;                                      // token rows per pass (4 m16 tiles)
constexpr int kMTiles = kTokens / 16;
constexpr int kStageUnits = 2;                                   // 64-input units per stage
constexpr int kStageCols = kStageUnits * kMoeUnitCols;           // 128 inputs
constexpr int kRowBytes = kStageCols * 2 + 16;                   // 272
constexpr int kStageBytes = kTokens * kRowBytes;
constexpr int kStages = 3;
constexpr int kSmemBytes = kStages * kStageBytes;                // 52,224
static_assert((kTokens * kStageCols * 2 / 16) % kThreads == 0, "whole 16-byte copies per thread");

template <MoeFp4Format F, bool kGateUp>
__global__ void __launch_bounds__(kThreads, 1) moe_fp4_tiled_kernel(GemmArgs p, int rows) {
  extern __shared__ __align__(16) uint8_t smem[];
  pdl_wait();  // routing (and, for down, gate-up's output) come from the kernels before
  pdl_launch_dependents();
  const int slot = blockIdx.y;
  const int expert = p.slot_expert[slot];
  if (expert < 0) return;
  const int begin = p.slot_begin[slot], count = p.slot_count[slot];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int tile0 = (blockIdx.x * kWarps + warp) * kTilesPerWarp;
  const bool active = tile0 * kMoeUnitRows < rows;  // rows is a multiple of 128: whole warps idle
  const int units = p.K / kMoeUnitCols, stages = units / kStageUnits;
  constexpr int kScaleBytes = moe_unit_scale_bytes(F);
  const int scale_offset = F == MoeFp4Format::Nvfp4 ? 2 * lane : 4 * g + 2 * (q >> 1);
  const uint8_t* wbase[kTilesPerWarp];
  const uint8_t* sbase[kTilesPerWarp];
#pragma unroll
  for (int i = 0; i < kTilesPerWarp; ++i) {
    const int tile = active ? tile0 + i : 0;
    wbase[i] = p.weights + expert * p.expert_weight_bytes + size_t(tile) * units * kMoeUnitBytes + lane * 16;
    sbase[i] = p.scales + expert * p.expert_scale_bytes + size_t(tile) * units * kScaleBytes + scale_offset;
  }
  const float* fac = p.factors + expert * kFactorsPerExpert;
  const uint32_t smem_base = smem_u32(smem);

  // Copy duty: thread t copies 16-byte pieces t, t + 256, … of a stage (row = piece / 16).
  constexpr int kPiecesPerRow = kStageCols * 2 / 16;  // 16
  constexpr int kCopies = kTokens * kPiecesPerRow / kThreads;  // 4
  for (int chunk = 0; chunk < count; chunk += kTokens) {
    const __nv_bfloat16* src_row[kCopies];
#pragma unroll
    for (int c = 0; c < kCopies; ++c) {
      const int row = (threadIdx.x + c * kThreads) / kPiecesPerRow, idx = chunk + row;
      src_row[c] = idx < count ? p.act + size_t(p.sorted_pairs[begin + idx] / p.act_row_divisor) * p.K : nullptr;
    }
    auto issue_stage = [&](int s) {
      if (s < stages) {
#pragma unroll
        for (int c = 0; c < kCopies; ++c) {
          const int piece = threadIdx.x + c * kThreads, row = piece / kPiecesPerRow, col = piece % kPiecesPerRow;
          const uint32_t dst = smem_base + (s % kStages) * kStageBytes + row * kRowBytes + col * 16;
          if (src_row[c]) cp_async16(dst, src_row[c] + s * kStageCols + col * 8, 16);
          else cp_async16(dst, p.act, 0);  // zero-fill: rows past the expert's tokens
        }
      }
      cp_async_commit();  // empty groups keep the wait count uniform
    };
    __syncthreads();  // the previous pass is done with every stage
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue_stage(s);

    float acc[kMTiles][2 * kTilesPerWarp][4];
#pragma unroll
    for (int m = 0; m < kMTiles; ++m)
#pragma unroll
      for (int n = 0; n < 2 * kTilesPerWarp; ++n) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.f;

    // Weights of a stage go to registers two stages ahead: their latency overlaps two stages of MMAs
    // (one block per SM: the bytes in flight must come from each warp).
    uint4 wq[kStageUnits][kTilesPerWarp], wq1[kStageUnits][kTilesPerWarp];
    uint32_t sc[kStageUnits][kTilesPerWarp], sc1[kStageUnits][kTilesPerWarp];
    auto load_weights = [&](int s, uint4 (&w)[kStageUnits][kTilesPerWarp], uint32_t (&c)[kStageUnits][kTilesPerWarp]) {
#pragma unroll
      for (int u = 0; u < kStageUnits; ++u)
#pragma unroll
        for (int i = 0; i < kTilesPerWarp; ++i) {
          const int unit = s * kStageUnits + u;
          const bool ok = active && s < stages;
          w[u][i] = ok ? __ldg(reinterpret_cast<const uint4*>(wbase[i] + size_t(unit) * kMoeUnitBytes)) : make_uint4(0, 0, 0, 0);
          c[u][i] = ok ? __ldg(reinterpret_cast<const unsigned short*>(sbase[i] + size_t(unit) * kScaleBytes)) : 0u;
        }
    };
    load_weights(0, wq, sc);
    load_weights(1, wq1, sc1);
    for (int s = 0; s < stages; ++s) {
      uint4 wq2[kStageUnits][kTilesPerWarp];
      uint32_t sc2[kStageUnits][kTilesPerWarp];
      load_weights(s + 2, wq2, sc2);
      cp_async_wait<kStages - 2>();
      __syncthreads();  // stage s landed for every thread; stage s-1's buffer is free for the copy below
      issue_stage(s + kStages - 1);
      if (active) {
        const uint8_t* stage = smem + (s % kStages) * kStageBytes;
#pragma unroll
        for (int u = 0; u < kStageUnits; ++u) {
          uint32_t s_lo[kTilesPerWarp], s_hi[kTilesPerWarp];
#pragma unroll
          for (int i = 0; i < kTilesPerWarp; ++i) {
            s_lo[i] = folded_scale_x2<F>(sc[u][i] & 0xffu);
            s_hi[i] = folded_scale_x2<F>(sc[u][i] >> 8);
          }
#pragma unroll
          for (int tp = 0; tp < 2; ++tp) {  // two k16 steps per 16-byte activation load
            uint4 x0[kMTiles], x8[kMTiles];
            const int col_bytes = (u * kMoeUnitCols + 16 * q + 8 * tp) * 2;
#pragma unroll
            for (int m = 0; m < kMTiles; ++m) {
              x0[m] = *reinterpret_cast<const uint4*>(stage + (16 * m + g) * kRowBytes + col_bytes);
              x8[m] = *reinterpret_cast<const uint4*>(stage + (16 * m + g + 8) * kRowBytes + col_bytes);
            }
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int t = 2 * tp + j;
              uint32_t b[2 * kTilesPerWarp][2];  // n8 tiles: rows 0–7 and 8–15 of each weight tile
#pragma unroll
              for (int i = 0; i < kTilesPerWarp; ++i) {
                const uint32_t word = t == 0 ? wq[u][i].x : t == 1 ? wq[u][i].y : t == 2 ? wq[u][i].z : wq[u][i].w;
                uint32_t a[4];
                dequant_a(word, s_lo[i], s_hi[i], a);
                b[2 * i][0] = a[0];
                b[2 * i][1] = a[2];
                b[2 * i + 1][0] = a[1];
                b[2 * i + 1][1] = a[3];
              }
#pragma unroll
              for (int m = 0; m < kMTiles; ++m) {
                const uint32_t af[4] = {j ? x0[m].z : x0[m].x, j ? x8[m].z : x8[m].x, j ? x0[m].w : x0[m].y,
                                        j ? x8[m].w : x8[m].y};
#pragma unroll
                for (int n = 0; n < 2 * kTilesPerWarp; ++n) mma_bf16(acc[m][n], af, b[n][0], b[n][1]);
              }
            }
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kStageUnits; ++u)
#pragma unroll
        for (int i = 0; i < kTilesPerWarp; ++i) {
          wq[u][i] = wq1[u][i];
          sc[u][i] = sc1[u][i];
          wq1[u][i] = wq2[u][i];
          sc1[u][i] = sc2[u][i];
        }
    }
    if (!active) continue;
    // acc[m][2i + h][c]: token row 16m + g (c < 2) or 16m + g + 8 (c ≥ 2), weight row 8h + 2q + (c & 1)
    // of tile tile0 + i.
#pragma unroll
    for (int m = 0; m < kMTiles; ++m)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int idx = chunk + 16 * m + g + 8 * half;
        if (idx >= count) continue;
        const int pair = p.sorted_pairs[begin + idx];
        const float topk_w = kGateUp ? p.topk_weights[pair] : 0.f;
#pragma unroll
        for (int i = 0; i < kTilesPerWarp; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float lo = acc[m][2 * i][2 * half + e], hi = acc[m][2 * i + 1][2 * half + e];
            if (kGateUp) store_fragment<true>(p, tile0 + i, 2 * q + e, pair, topk_w, fac[kGateFactor], fac[kUpFactor], lo, hi);
            else store_fragment<false>(p, tile0 + i, 2 * q + e, pair, 0.f, fac[kDownFactor], fac[kDownFactor], lo, hi);
          }
      }
  }
}

template <MoeFp4Format F, bool kGateUp>
void launch(const GemmArgs& args, int rows, int max_slots, cudaStream_t stream) {
  auto kernel = moe_fp4_tiled_kernel<F, kGateUp>;
  allow_dynamic_smem(kernel, kSmemBytes);
  launch_programmatic(kernel, dim3((rows + kBlockRows - 1) / kBlockRows, max_slots), dim3(kThreads), kSmemBytes,
                      stream, args, rows);
}

}  // namespace

KernelLaunch moe_fp4_tiled_launch(MoeFp4Format format, bool gate_up) {
  return {"moe_fp4_tiled_kernel<" + format_template_arg(format) + (gate_up ? ", true>" : ", false>"), kThreads,
          size_t(kSmemBytes)};
}

void moe_fp4_tiled_gemm(MoeFp4Format format, bool gate_up, const GemmArgs& args, int rows, int max_slots,
                        cudaStream_t stream) {
  DSV4_CHECK(args.K % kStageCols == 0 && rows % 128 == 0, "moe_fp4_tiled_gemm: K {} / rows {} not multiples of 128",
             args.K, rows);
  if (format == MoeFp4Format::Mxfp4) {
    if (gate_up) launch<MoeFp4Format::Mxfp4, true>(args, rows, max_slots, stream);
    else launch<MoeFp4Format::Mxfp4, false>(args, rows, max_slots, stream);
  } else {
    if (gate_up) launch<MoeFp4Format::Nvfp4, true>(args, rows, max_slots, stream);
    else launch<MoeFp4Format::Nvfp4, false>(args, rows, max_slots, stream);
  }
}

}  // namespace dsv4::cuda::moe_detail
