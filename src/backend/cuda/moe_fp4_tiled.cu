// The W4A16 expert GEMMs for many tokens per expert (prefill): tokens on the MMA's M side, weights on
// N. A block takes 128 weight rows (8 warps × one 16-row tile) of one expert slot and walks its
// tokens 64 at a time. Per stage of 128 inputs, the 64 tokens' activations, the block's e2m1 weights
// and their scales go through a cp.async ring in shared memory; each warp unpacks its weights (e2m1 →
// bf16 with the block scale folded in, as the decode kernels do) once per 64 tokens, so an unpacked
// register feeds 4 MMAs (the 4 token tiles). Nothing is carried in registers across stages but the
// accumulators, so two blocks fit an SM (≤ 128 registers; two tiles per warp would need ~190).
//
// Register layouts: the unit layout (moe_fp4.h) gives lane (g, q) the A fragments of weight rows g
// and g+8 for the unit's four k16 steps, inputs 16q … 16q+15 of the unit in the order the MMA's
// k slots expect. Read as B operands, {a0, a2} are the fragment of rows 0–7 and {a1, a3} that of rows
// 8–15. The activation A fragments need, for token row r and step t, inputs 16q + 4t … 16q + 4t + 3:
// one 16-byte shared load gives those of two steps. Activation rows are padded to 272 bytes so that
// the 2 rows × 4 lanes of a quarter warp hit distinct banks.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/moe_fp4_kernels.cuh"

namespace dsv4::cuda::moe_detail {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kTilesPerWarp = 1;                                   // 16-row weight tiles per warp
constexpr int kBlockTiles = kWarps * kTilesPerWarp;                // 8
constexpr int kBlockRows = kBlockTiles * kMoeUnitRows;             // 128
constexpr int kTokens = 64;                                        // token rows per pass (4 m16 tiles)
constexpr int kMTiles = kTokens / 16;
constexpr int kStageUnits = 2;                                     // 64-input units per stage
constexpr int kStageCols = kStageUnits * kMoeUnitCols;             // 128 inputs
constexpr int kRowBytes = kStageCols * 2 + 16;                     // 272
constexpr int kActBytes = kTokens * kRowBytes;                     // 17,408
constexpr int kWeightBytes = kBlockTiles * kStageUnits * kMoeUnitBytes;  // 8,192
constexpr int kMaxStages = 3;

template <MoeFp4Format F>
constexpr int stage_bytes() {
  return kActBytes + kWeightBytes + kBlockTiles * kStageUnits * moe_unit_scale_bytes(F);
}

// Copies per thread per stage: activations, weights, scales (16-byte pieces).
constexpr int kActPieces = kTokens * kStageCols * 2 / 16 / kThreads;   // 4
constexpr int kWeightPieces = kWeightBytes / 16 / kThreads;            // 2
static_assert(kActPieces * kThreads * 16 == kTokens * kStageCols * 2 && kWeightPieces * kThreads * 16 == kWeightBytes &&
                  (kStageCols * 2 / 16) % kActPieces == 0,
              "whole 16-byte copies per thread");

template <MoeFp4Format F, bool kGateUp>
__global__ void __launch_bounds__(kThreads, 2) moe_fp4_tiled_kernel(GemmArgs p, int rows, int ring) {
  extern __shared__ __align__(16) uint8_t smem[];
  pdl_wait();  // routing (and, for down, gate-up's output) come from the kernels before
  pdl_launch_dependents();
  const int slot = blockIdx.y;
  const int expert = p.slot_expert[slot];
  if (expert < 0) return;
  const int begin = p.slot_begin[slot], count = p.slot_count[slot];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int block_tile0 = blockIdx.x * kBlockTiles;
  const int block_tiles = min(kBlockTiles, rows / kMoeUnitRows - block_tile0);  // rows: a multiple of 128
  const bool active = warp * kTilesPerWarp < block_tiles;                       // whole warps idle
  const int units = p.K / kMoeUnitCols, stages = units / kStageUnits;
  constexpr int kScaleBytes = moe_unit_scale_bytes(F);
  constexpr int kStageBytes = stage_bytes<F>();
  const int scale_offset = F == MoeFp4Format::Nvfp4 ? 2 * lane : 4 * g + 2 * (q >> 1);
  const uint8_t* weights = p.weights + expert * p.expert_weight_bytes + size_t(block_tile0) * units * kMoeUnitBytes;
  const uint8_t* scales = p.scales + expert * p.expert_scale_bytes + size_t(block_tile0) * units * kScaleBytes;
  const float* fac = p.factors + expert * kFactorsPerExpert;
  const uint32_t smem_base = smem_u32(smem);

  // Stage layout: activations [64 rows × 272 B], weights [tile][unit][512 B], scales [tile][unit][kScaleBytes].
  constexpr int kPiecesPerRow = kStageCols * 2 / 16;  // 16
  constexpr int kScalePieces = kBlockTiles * kStageUnits * kScaleBytes / 16;
  for (int chunk = 0; chunk < count; chunk += kTokens) {
    // Activation copies: thread t copies the kActPieces consecutive 16-byte pieces of row t / 4 from
    // piece (t % 4) · kActPieces on; src_row = its activation row, −1 past the expert's tokens.
    const int copy_row = threadIdx.x / (kPiecesPerRow / kActPieces), copy_col = threadIdx.x % (kPiecesPerRow / kActPieces) * kActPieces;
    const int src_row = chunk + copy_row < count ? p.sorted_pairs[begin + chunk + copy_row] / p.act_row_divisor : -1;
    int fill_slot = 0;  // ring slot of the next stage to copy
    auto issue_stage = [&](int s) {
      if (s < stages) {
        const uint32_t base = smem_base + fill_slot * kStageBytes;
#pragma unroll
        for (int c = 0; c < kActPieces; ++c) {
          const uint32_t dst = base + copy_row * kRowBytes + (copy_col + c) * 16;
          if (src_row >= 0) cp_async16(dst, p.act + size_t(src_row) * p.K + s * kStageCols + (copy_col + c) * 8, 16);
          else cp_async16(dst, p.act, 0);  // zero-fill: rows past the expert's tokens
        }
#pragma unroll
        for (int c = 0; c < kWeightPieces; ++c) {
          const int piece = threadIdx.x + c * kThreads, tile = piece / (kStageUnits * 32);
          const int u = piece / 32 % kStageUnits, part = piece % 32;
          if (tile < block_tiles)
            cp_async16(base + kActBytes + piece * 16,
                       weights + (size_t(tile) * units + s * kStageUnits + u) * kMoeUnitBytes + part * 16, 16);
        }
        for (int piece = threadIdx.x; piece < kScalePieces; piece += kThreads) {
          constexpr int kPerUnit = kScaleBytes / 16;
          const int tile = piece / (kStageUnits * kPerUnit), u = piece / kPerUnit % kStageUnits, part = piece % kPerUnit;
          if (tile < block_tiles)
            cp_async16(base + kActBytes + kWeightBytes + piece * 16,
                       scales + (size_t(tile) * units + s * kStageUnits + u) * kScaleBytes + part * 16, 16);
        }
        fill_slot = fill_slot + 1 == ring ? 0 : fill_slot + 1;
      }
      cp_async_commit();  // empty groups keep the wait count uniform
    };
    __syncthreads();  // the previous pass is done with every stage
    for (int s = 0; s < ring - 1; ++s) issue_stage(s);

    float acc[kMTiles][2 * kTilesPerWarp][4];
#pragma unroll
    for (int m = 0; m < kMTiles; ++m)
#pragma unroll
      for (int n = 0; n < 2 * kTilesPerWarp; ++n) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.f;

    int use_slot = 0;
    for (int s = 0; s < stages; ++s) {
      // Stage s landed for every thread; the slot of stage s-1 is free for the copy below.
      if (ring == 2) cp_async_wait<0>();
      else cp_async_wait<kMaxStages - 2>();
      __syncthreads();
      issue_stage(s + ring - 1);
      if (active) {
        const uint32_t stage = smem_base + use_slot * kStageBytes;
        const uint32_t wsm = stage + kActBytes + warp * kTilesPerWarp * kStageUnits * kMoeUnitBytes + lane * 16;
        const uint32_t ssm = stage + kActBytes + kWeightBytes + warp * kTilesPerWarp * kStageUnits * kScaleBytes + scale_offset;
#pragma unroll 1
        for (int u = 0; u < kStageUnits; ++u) {
          uint4 wq[kTilesPerWarp];
          uint32_t s_lo[kTilesPerWarp], s_hi[kTilesPerWarp];
#pragma unroll
          for (int i = 0; i < kTilesPerWarp; ++i) {
            wq[i] = ld_shared_v4(wsm + (i * kStageUnits + u) * kMoeUnitBytes);
            const uint32_t sc = ld_shared_u16(ssm + (i * kStageUnits + u) * kScaleBytes);
            s_lo[i] = folded_scale_x2<F>(sc & 0xffu);
            s_hi[i] = folded_scale_x2<F>(sc >> 8);
          }
#pragma unroll
          for (int tp = 0; tp < 2; ++tp) {  // two k16 steps per 16-byte activation load
            uint32_t b[2][2 * kTilesPerWarp][2];  // [step][n8 tile: rows 0–7 / 8–15 of each weight tile]
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
              for (int i = 0; i < kTilesPerWarp; ++i) {
                const int t = 2 * tp + j;
                const uint32_t word = t == 0 ? wq[i].x : t == 1 ? wq[i].y : t == 2 ? wq[i].z : wq[i].w;
                uint32_t a[4];
                dequant_a(word, s_lo[i], s_hi[i], a);
                b[j][2 * i][0] = a[0];
                b[j][2 * i][1] = a[2];
                b[j][2 * i + 1][0] = a[1];
                b[j][2 * i + 1][1] = a[3];
              }
            const int col_bytes = (u * kMoeUnitCols + 16 * q + 8 * tp) * 2;
#pragma unroll
            for (int m = 0; m < kMTiles; ++m) {
              const uint4 x0 = ld_shared_v4(stage + (16 * m + g) * kRowBytes + col_bytes);
              const uint4 x8 = ld_shared_v4(stage + (16 * m + g + 8) * kRowBytes + col_bytes);
#pragma unroll
              for (int j = 0; j < 2; ++j) {
                const uint32_t af[4] = {j ? x0.z : x0.x, j ? x8.z : x8.x, j ? x0.w : x0.y, j ? x8.w : x8.y};
#pragma unroll
                for (int n = 0; n < 2 * kTilesPerWarp; ++n) mma_bf16(acc[m][n], af, b[j][n][0], b[j][n][1]);
              }
            }
          }
        }
      }
      use_slot = use_slot + 1 == ring ? 0 : use_slot + 1;
    }
    if (!active) continue;
    // acc[m][2i + h][c]: token row 16m + g (c < 2) or 16m + g + 8 (c ≥ 2), weight row 8h + 2q + (c & 1)
    // of tile tile0 + i.
    const int tile0 = block_tile0 + warp * kTilesPerWarp;
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

// Ring depth: three stages where shared memory allows (26.4 / 27.4 KB per stage: sm_90 and sm_120
// both take three), else two.
template <MoeFp4Format F>
int ring_stages() {
  static const int stages = [] {
    const int optin = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    const int n = std::min(kMaxStages, optin / stage_bytes<F>());
    DSV4_CHECK(n >= 2, "moe_fp4_tiled_gemm: {} bytes of shared memory per block hold fewer than two {}-byte stages",
               optin, stage_bytes<F>());
    return n;
  }();
  return stages;
}

template <MoeFp4Format F, bool kGateUp>
void launch(const GemmArgs& args, int rows, int max_slots, cudaStream_t stream) {
  auto kernel = moe_fp4_tiled_kernel<F, kGateUp>;
  const int ring = ring_stages<F>();
  const int smem = ring * stage_bytes<F>();
  static const bool configured = [&] {
    DSV4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  launch_programmatic(kernel, dim3((rows + kBlockRows - 1) / kBlockRows, max_slots), dim3(kThreads), smem, stream,
                      args, rows, ring);
}

}  // namespace

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
