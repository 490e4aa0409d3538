// W4A8 expert GEMMs for large token counts on sm_90a (SPEC.md §2.2, §2.4, §3.7): MXFP4 weights
// become e4m3 in shared memory (exact, see backend/moe_fp4_layout.h), activations are e4m3 with one
// power-of-two scale per 128 channels (act_quant_fp8.h), and FP8 wgmma multiplies them with f32
// accumulation.
//
// Persistent blocks (one per SM) take jobs = (expert slot, 128-row tile of its weight matrix, 128-token
// tile of the slot's tokens). A block is warp-specialised. Per 128-input chunk, warpgroup 2 copies the
// activation tile (gathered rows), the tokens' activation scales and the raw FP4 weight tile with its
// table indices (cp.async that arrive on the stage's `loaded` mbarrier when they land); warpgroups 0
// and 1 turn the weights into e4m3 (a table lookup per nibble) and mark the stage full (a named
// barrier per consumer warpgroup); warpgroups 3 and 4 (64 tokens each) run four m64n128k32 wgmma per
// chunk into a fresh accumulator, mark the stage empty (mbarrier) and fold the product into the f32
// sum with the activation scales.
// Folding per 128 inputs is what the reference does too (its scale changes every 128), and it keeps
// the tensor core's reduced-precision FP8 accumulation to 128-long runs. Five stages; the ring runs on
// across jobs, so the next job's copies overlap the current one's last chunks and epilogue.
// Shared memory: per stage [128 tokens × 128 B | 128 weight rows × 128 B | 128 scales], both tiles
// K-major with the 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)), what the wgmma
// descriptors say; then per stage the raw weights.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/moe_fp4.h"
#include "backend/cuda/moe_fp4_kernels.cuh"
#include "core/error.h"

namespace dsv4::cuda::moe_detail {
namespace {

constexpr int kTileM = 128, kTileN = 128, kTileK = 128;
// Warpgroups 0–1 convert, 2 loads, 3–4 multiply.
constexpr int kConverters = 256, kLoaders = 128, kConsumers = 256;
constexpr int kProducers = kConverters + kLoaders, kThreads = kProducers + kConsumers;
// Registers per thread: the block starts with 96 each (65536 / 640, rounded down to 8); setmaxnreg
// moves what the producers give up to the consumers.
constexpr int kLaunchRegs = 96, kProducerRegs = 64, kConsumerRegs = 144;
static_assert(kConsumers * (kConsumerRegs - kLaunchRegs) <= kProducers * (kLaunchRegs - kProducerRegs), "register pool");
constexpr int kStages = 5;
// Stage: activation tile (at 0) | e4m3 weight tile | activation scales.
constexpr int kStageB = kTileM * kTileK, kStageScale = kStageB + kTileN * kTileK, kStageBytes = 33 * 1024;
static_assert(kStageScale + kTileM * 4 <= kStageBytes && kStageBytes % 1024 == 0, "stage layout");
// Raw FP4 weights of each stage, copied by the loaders for the converters: 512 slices (16 units × 32
// lanes) × 16 B, then their table-index words; slice σ = i · kConverters + converter thread.
constexpr int kSlices = 512;
constexpr int kRawIndex = kSlices * 16, kRawBytes = kRawIndex + kSlices * 4;
constexpr int kSmemBytes = kStages * (kStageBytes + kRawBytes) + 1024;  // + slack to align to 1024 B

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// wgmma shared-memory descriptor: K-major, 128-byte swizzle, 8-row groups 1024 B apart.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// d (+)= A · Bᵀ, A 64×32 and B 128×32 e4m3 from shared memory, d: this thread's 64 f32 accumulators.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
}

// Named barrier 1 + 2s + w: stage s is full for consumer warpgroup w (the converters arrive on both;
// one barrier per consumer warpgroup, so that one may start the next chunk's MMAs while the other
// still folds the last one).
constexpr int kFullBarThreads = kConverters + kConsumers / 2;
__device__ __forceinline__ void bar_sync(int id) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kFullBarThreads) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kFullBarThreads) : "memory"); }
__device__ __forceinline__ int full_bar(int c, int w) { return 1 + 2 * (c % kStages) + w; }
// mbarriers (ptx_primitives.cuh): a stage's copies have landed (each loader thread's cp.async arrives
// on completion), and a stage is empty (each consumer thread arrives). No thread waits on copies of
// its own, so no barrier or fence of a thread with copies in flight stands in their way.
// (a & c) | (b & ~c) and a | (b & c), as one LOP3 each.
__device__ __forceinline__ uint32_t select_bits(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xE4;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ uint32_t or_masked(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xF8;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// One 16-byte lane slice of a unit (moe_fp4.h: rows g and g+8, 16 consecutive inputs) → 16 e4m3
// bytes per row, in input order. Word t's nibbles 0,4,2,6 are row g's inputs 4t+0..3, nibbles
// 1,5,3,7 row g+8's. A nibble's magnitude bits select its byte of the row's 8-entry table (PRMT; the
// selector's bit 3 must be clear), its sign bit moves to bit 7.
__device__ __forceinline__ void slice_to_e4m3(uint4 w, uint2 table_g, uint2 table_g8, uint4& row_g, uint4& row_g8) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  uint32_t out_g[4], out_g8[4];
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const uint32_t x = words[t];
    const uint32_t swapped = __byte_perm(x, 0, 0x3120);  // bytes (n0 n1)(n4 n5)(n2 n3)(n6 n7)
    const uint32_t mag = x & 0x77777777u;
    const uint32_t sel_g = select_bits(mag, mag >> 12, 0x0F0Fu);         // n0 n4 n2 n6
    const uint32_t sel_g8 = select_bits(mag >> 4, mag >> 16, 0x0F0Fu);   // n1 n5 n3 n7
    out_g[t] = or_masked(__byte_perm(table_g.x, table_g.y, sel_g), swapped << 4, 0x80808080u);
    out_g8[t] = or_masked(__byte_perm(table_g8.x, table_g8.y, sel_g8), swapped, 0x80808080u);
  }
  row_g = make_uint4(out_g[0], out_g[1], out_g[2], out_g[3]);
  row_g8 = make_uint4(out_g8[0], out_g8[1], out_g8[2], out_g8[3]);
}
#endif

// kPartials (down only): the f32 outputs into W4a8Args::partials (a template argument: the branch
// alone made the down kernel spill).
template <bool kGateUp, bool kPartials>
__global__ void __launch_bounds__(kThreads, 1) moe_w4a8_gemm_kernel(W4a8Args p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  __shared__ uint2 tables[kW4a8Tables];
  __shared__ __align__(8) uint64_t loaded[kStages], emptied[kStages];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
  if (tid < kW4a8Tables * 8) {
    // Table i, entry c: e4m3(e2m1(c) · 2^(i + kW4a8MinShift)), exact or rounded to nearest even.
    const int i = tid / 8, c = tid % 8;
    const float e2m1 = c < 2 ? 0.5f * c : float(1 << (c / 2 - 1)) * (1.f + 0.5f * (c & 1));
    const uint8_t code = uint8_t(__nv_cvt_float_to_fp8(ldexpf(e2m1, i + kW4a8MinShift), __NV_SATFINITE, __NV_E4M3));
    reinterpret_cast<uint8_t*>(tables)[tid] = code;
  }
  if (tid < kStages) {
    mbar_init(smem_u32(&loaded[tid]), kLoaders);
    mbar_init(smem_u32(&emptied[tid]), kConsumers);
  }
  pdl_wait();  // routing, activations and (down) the gate-up output come from the kernels before
  pdl_launch_dependents();
  __syncthreads();
  const int n_tiles = p.rows / kTileN, items = p.max_slots * n_tiles, chunks = p.K / kTileK;
  const uint32_t smem = (smem_u32(smem_raw) + 1023) & ~1023u;
  // Stages and their barriers are indexed by the block's running chunk count, across jobs.
  auto stage = [&](int c) { return smem + (c % kStages) * kStageBytes; };
  // Jobs: (slot, weight tile) items round-robin over the persistent blocks (neighbouring blocks take
  // the tiles of one slot, so its activation rows are shared in L2), then each item's token tiles.
  // Producers and consumers walk the same sequence.
  auto for_each_job = [&](auto&& job) {
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
      const int slot = item / n_tiles, n_tile = item % n_tiles;
      const int expert = p.slot_expert[slot];
      if (expert < 0) continue;
      const int begin = p.slot_begin[slot], count = p.slot_count[slot];
      for (int m0 = 0; m0 < count; m0 += kTileM) job(expert, n_tile, begin, count, m0);
    }
  };

  if (warp < kProducers / 32) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    // ---- Producers. Converter thread t (warp w = t / 32) owns slices σ = i · kConverters + t, i = 0, 1:
    // lane t % 32 of unit row tile 8·n_tile + w, unit half i ^ (g & 1) of the chunk (so that a
    // quarter-warp's 16-byte stores land in 8 distinct bank groups).
    const uint32_t raw0 = smem + kStages * kStageBytes;
    auto raw = [&](int c) { return raw0 + (c % kStages) * kRawBytes; };
    int c0 = 0;  // chunks before the current job
    if (warp >= kConverters / 32) {
      // Loaders: every copy of a chunk (activation rows, activation scales, raw weights, table
      // indices) as cp.async that arrive on the stage's `loaded` mbarrier when they land. Loader
      // thread t copies slices σ = t + kLoaders · m, m = 0..3 (converter thread t + kLoaders·(m & 1),
      // its slice m / 2).
      constexpr int kIndexBytes = moe_unit_scale_bytes(MoeFp4Format::Mxfp4);
      const int lt = tid - kConverters, lw = lt / 32;
      const int units_per_row = p.K / kMoeUnitCols;
      const int a_row0 = lt / 8;
      const uint32_t a_off0 = a_row0 * 128 + (((lt % 8) ^ (a_row0 & 7)) << 4);  // rows + 16 j keep r & 7
      for_each_job([&](int expert, int n_tile, int begin, int count, int m0) {
        const uint8_t* w_src[2];
        const uint8_t* i_src[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // h = m & 1: unit row tile lw + 4h
          const size_t unit0 = size_t(n_tile * 8 + lw + 4 * h) * units_per_row;
          w_src[h] = p.weights + expert * p.expert_weight_bytes + unit0 * kMoeUnitBytes + lane * 16;
          i_src[h] = p.index + expert * p.expert_index_bytes + unit0 * kIndexBytes + 4 * g;
        }
        // Thread copies 16-byte chunk lt % 8 of token rows lt / 8 + 16 j, and row lt's scale; rows
        // past the slot's tokens are zero-filled (scale 0).
        const uint8_t* a_base = p.act + (lt % 8) * 16;
        uint32_t a_row_off[8];  // row · K (< 2^31: the workspace's rows × K)
        uint32_t a_valid = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int idx = m0 + a_row0 + 16 * j;
          const int row = idx < count ? p.sorted_pairs[begin + idx] / p.act_row_divisor : 0;
          a_row_off[j] = uint32_t(row) * uint32_t(p.K);
          a_valid |= uint32_t(idx < count) << j;
        }
        const int sx_idx = m0 + lt;
        const float* sx_src = p.act_scale + size_t(sx_idx < count ? p.sorted_pairs[begin + sx_idx] / p.act_row_divisor : 0) * chunks;
        const int sx_bytes = sx_idx < count ? 4 : 0;
        for (int kc = 0; kc < chunks; ++kc) {
          const int c = c0 + kc;
          if (c >= kStages) mbar_wait(smem_u32(&emptied[c % kStages]), (c / kStages - 1) & 1);
          const uint32_t st = stage(c), r = raw(c);
#pragma unroll
          for (int j = 0; j < 8; ++j)
            cp_async16(st + a_off0 + j * 16 * 128, a_base + a_row_off[j] + kc * kTileK, (a_valid >> j) & 1 ? 16 : 0);
          cp_async4(st + kStageScale + lt * 4, sx_src + kc, sx_bytes);
#pragma unroll
          for (int m = 0; m < 4; ++m) {
            const int u = 2 * kc + ((m >> 1) ^ (g & 1)), sigma = lt + kLoaders * m;
            cp_async16(r + sigma * 16, w_src[m & 1] + size_t(u) * kMoeUnitBytes);
            cp_async4(r + kRawIndex + sigma * 4, i_src[m & 1] + size_t(u) * kIndexBytes);
          }
          cp_async_mbar_arrive(smem_u32(&loaded[c % kStages]));
        }
        c0 += chunks;
      });
      cp_async_wait_all();  // no copy outlives its thread
      return;
    }
    // Converters: raw FP4 → e4m3 weight tile, then the stage is full.
    uint32_t b_off[2][2];  // [slice][row g, row g+8] inside the stage
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int chunk16 = 4 * (i ^ (g & 1)) + q;
      // Rows g and g+8 of the unit: gate-up interleaves gate and up of each channel.
      const int r0 = kGateUp ? 16 * warp + 2 * g : 16 * warp + g, r1 = kGateUp ? r0 + 1 : r0 + 8;
      b_off[i][0] = kStageB + r0 * 128 + ((chunk16 ^ (r0 & 7)) << 4);
      b_off[i][1] = kStageB + r1 * 128 + ((chunk16 ^ (r1 & 7)) << 4);
    }
    const int index_shift = 16 * (q >> 1);  // this lane's two index bytes inside the 4 copied
    for_each_job([&](int, int, int, int, int) {
      for (int kc = 0; kc < chunks; ++kc) {
        const int c = c0 + kc;
        const uint32_t st = stage(c), r = raw(c);
        mbar_wait(smem_u32(&loaded[c % kStages]), (c / kStages) & 1);
        // Loads of both slices first, then the lookups, then the stores: the slices overlap.
        uint4 w[2];
        uint32_t ix[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int sigma = i * kConverters + tid;
          w[i] = ld_shared_v4(r + sigma * 16);
          ix[i] = ld_shared_u32(r + kRawIndex + sigma * 4) >> index_shift;
        }
        uint4 out[2][2];
#pragma unroll
        for (int i = 0; i < 2; ++i) slice_to_e4m3(w[i], tables[ix[i] & 0xff], tables[(ix[i] >> 8) & 0xff], out[i][0], out[i][1]);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          st_shared_v4(st + b_off[i][0], out[i][0]);
          st_shared_v4(st + b_off[i][1], out[i][1]);
        }
        // The e4m3 tile and (seen through `loaded`) the loaders' activation copies, for the tensor cores.
        fence_proxy_async();
        bar_arrive(full_bar(c, 0));
        bar_arrive(full_bar(c, 1));
      }
      c0 += chunks;
    });
    return;
  }

  // ---- Consumers: warpgroup c (3, 4) multiplies token rows 64·(c − 3) … +63.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
  const int cw = warp / 4 - kProducers / 128;
  const int m_lo = 64 * cw + 16 * (warp % 4) + g;  // this thread's accumulator rows: m_lo, m_lo + 8
  int c0 = 0;
  for_each_job([&](int expert, int n_tile, int begin, int count, int m0) {
    float acc[64], part[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    for (int kc = 0; kc < chunks; ++kc) {
      const int c = c0 + kc;
      const uint32_t st = stage(c);
      bar_sync(full_bar(c, cw));
      fence_operands(part);
      wgmma_fence();
      // K step j starts 32 bytes further along the rows: +2 in the descriptors' address field.
      const uint64_t desc_a = smem_desc(st + cw * 64 * kTileK), desc_b = smem_desc(st + kStageB);
#pragma unroll
      for (int j = 0; j < kTileK / 32; ++j) wgmma_m64n128k32_e4m3(part, desc_a + 2 * j, desc_b + 2 * j, j > 0);
      wgmma_commit();
      const float sx0 = ld_shared_f32(st + kStageScale + m_lo * 4), sx1 = ld_shared_f32(st + kStageScale + (m_lo + 8) * 4);
      wgmma_wait_all();
      fence_operands(part);
      mbar_arrive(smem_u32(&emptied[c % kStages]));
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = fmaf(part[i], (i & 2) ? sx1 : sx0, acc[i]);
    }
    c0 += chunks;

    // Epilogue (the producers already fill the stages for the next job). Everything it reads is loaded
    // before its first store. Accumulator i: n8 block j = i / 4, token row m_lo + 8·((i / 2) & 1),
    // column 8j + 2q + (i & 1).
    int pair_of[2];
    float topk_w[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int idx = m0 + m_lo + 8 * h;
      pair_of[h] = idx < count ? p.sorted_pairs[begin + idx] : -1;
      topk_w[h] = kGateUp && pair_of[h] >= 0 ? p.topk_weights[pair_of[h]] : 0.f;
    }
    const float* row_scale = p.row_scale + size_t(expert) * p.rows + n_tile * kTileN;
    float2 rs[kTileN / 8];
#pragma unroll
    for (int j = 0; j < kTileN / 8; ++j) rs[j] = *reinterpret_cast<const float2*>(row_scale + 8 * j + 2 * q);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int pair = pair_of[h];
      if (pair < 0) continue;
      __nv_bfloat16* out = p.out + size_t(pair) * p.out_cols;
      float* partial = kPartials ? partial_row(p.partials, pair, p.partial_k, p.out_cols) + kTileN * n_tile + 2 * q : nullptr;
#pragma unroll
      for (int j = 0; j < kTileN / 8; ++j) {
        const float v0 = acc[4 * j + 2 * h] * rs[j].x, v1 = acc[4 * j + 2 * h + 1] * rs[j].y;
        if (kGateUp) {
          // Columns 2c, 2c+1 are gate and up of channel c = 64·n_tile + 4j + q (SPEC §3.7).
          const float gate = fminf(bf16_round(v0), p.swiglu_limit);
          const float up = fminf(fmaxf(bf16_round(v1), -p.swiglu_limit), p.swiglu_limit);
          out[(kTileN / 2) * n_tile + 4 * j + q] = __float2bfloat16_rn(gate / (1.f + expf(-gate)) * up * topk_w[h]);
        } else if (kPartials) {
          *reinterpret_cast<float2*>(partial + 8 * j) = make_float2(v0, v1);
        } else {
          *reinterpret_cast<__nv_bfloat162*>(out + kTileN * n_tile + 8 * j + 2 * q) = __floats2bfloat162_rn(v0, v1);
        }
      }
    }
  });
#else
  __trap();  // launched only where moe_w4a8_supported() holds
#endif
}

}  // namespace

KernelLaunch moe_w4a8_launch(bool gate_up, bool partials) {
  return {gate_up    ? "moe_w4a8_gemm_kernel<true, false>"
          : partials ? "moe_w4a8_gemm_kernel<false, true>"
                     : "moe_w4a8_gemm_kernel<false, false>",
          kThreads, size_t(kSmemBytes)};
}

bool moe_w4a8_supported() {
  static const bool supported = runs_sm90a_code(moe_w4a8_gemm_kernel<true, false>, moe_w4a8_gemm_kernel<false, false>,
                                                moe_w4a8_gemm_kernel<false, true>);
  return supported;
}

void moe_w4a8_gemm(bool gate_up, const W4a8Args& args, int max_slots, cudaStream_t stream) {
  if (!moe_w4a8_supported()) fail("moe_fp4: the W4A8 path needs an sm_90 GPU and a build with sm_90a");
  if (args.rows % kTileN || args.K % kTileK) fail("moe_fp4 W4A8: rows {} and K {} must be multiples of 128", args.rows, args.K);
  auto kernel = gate_up          ? moe_w4a8_gemm_kernel<true, false>
                : args.partials ? moe_w4a8_gemm_kernel<false, true>
                                : moe_w4a8_gemm_kernel<false, false>;
  allow_dynamic_smem(kernel, kSmemBytes);
  static const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  W4a8Args a = args;
  a.max_slots = max_slots;
  const int items = max_slots * (args.rows / kTileN);
  launch_programmatic(kernel, dim3(std::min(items, sms)), dim3(kThreads), kSmemBytes, stream, a);
}

}  // namespace dsv4::cuda::moe_detail
