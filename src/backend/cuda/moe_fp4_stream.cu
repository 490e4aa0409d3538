// Streaming decode GEMM of the FP4 MoE (W4A16, SPEC.md §3.7): the expert GEMMs at a few tokens per
// expert, where the time should be the bytes of the packed weights. Needs sm_90 or later (the bulk
// copy engine and mbarrier transaction counts): sm_90a and sm_120a. Measured slower than the register
// decode kernel on the H200 (docs/perf/moe_fp4.md: both are bound by the unpacking's instruction
// issue, not by memory), so the dispatcher does not pick it; it runs when forced and is tested.
//
// Work is a flat list of items (pass, 16-row weight tile); a pass is ≤ 8 rows (tokens) of one expert,
// listed by moe_route_pairs(). One block per SM takes a contiguous range of items, so that even one
// token (6 experts × 256 tiles) spreads evenly over every SM without splitting K across blocks.
//
// The block is warp-specialised. One producer thread streams the range's packed weights and scales
// through a ring of shared-memory stages with the bulk copy engine: a stage is kConsumerWarps · UPS
// units of one tile (the whole tile where K allows), contiguous in the unit layout, so one copy for
// the weights and one for the scales, completing on the stage's `full` mbarrier. Sixteen consumer
// warps split each stage's units (warp w takes units w, w + 16, …: the same K slice of every tile, so
// a pass's activations stay in registers), wait on `full`, multiply, and release the stage on its
// `empty` mbarrier — no block-wide barrier anywhere, so the copies run ahead by the whole ring while
// the consumers drift. At a tile's end each warp parks its K slice's partial sums in one of two
// reduction buffers and arrives on its `ready` mbarrier; warp (item % 16) waits for the 16 slices,
// frees the buffer and runs the epilogue, while the other warps go on with the next tile.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/moe_fp4_kernels.cuh"
#include "core/error.h"

namespace dsv4::cuda::moe_detail {
namespace {

constexpr int kConsumerWarps = 16;
constexpr int kThreads = (kConsumerWarps + 1) * 32;  // + the producer warp
constexpr int kMaxStages = 16;
constexpr int kPartialBytes = kConsumerWarps * 32 * 16;  // one float4 per consumer lane

// Shared memory: ring weights | ring scales | 2 reduction buffers | mbarriers (full, empty per stage;
// ready, freed per reduction buffer).
struct SmemLayout {
  int stages;
  size_t scales, partial, bars, total;
};
inline SmemLayout smem_layout(int stage_units, int scale_bytes, int stages) {
  SmemLayout l{};
  l.stages = stages;
  l.scales = size_t(stages) * stage_units * kMoeUnitBytes;
  l.partial = (l.scales + size_t(stages) * stage_units * scale_bytes + 15) / 16 * 16;
  l.bars = l.partial + 2 * kPartialBytes;
  l.total = l.bars + (2 * stages + 4) * sizeof(uint64_t);
  return l;
}

template <MoeFp4Format F, bool kGateUp, int UPS>
__global__ void __launch_bounds__(kThreads, 1)
    moe_fp4_stream_kernel(GemmArgs p, int tiles, int stages, uint32_t off_scales, uint32_t off_partial,
                          uint32_t off_bars) {
#if __CUDA_ARCH__ >= 900
  constexpr int kUnits = kConsumerWarps * UPS;
  constexpr int kScaleBytes = moe_unit_scale_bytes(F);
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t base = smem_u32(smem);
  const uint32_t full = base + off_bars, empty = full + 8 * stages, ready = empty + 8 * stages, freed = ready + 16;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(full + 8 * s, 1);
      mbar_init(empty + 8 * s, kConsumerWarps);
    }
    for (int b = 0; b < 2; ++b) {
      mbar_init(ready + 8 * b, kConsumerWarps);
      mbar_init(freed + 8 * b, 1);
    }
    fence_mbar_init();
  }
  __syncthreads();

  // The gate-up GEMM reads the routing lists right away, so it waits for the route kernel first. The
  // down GEMM reads those lists before its wait — they were complete before the gate-up grid got past
  // its own wait, and they are read through L2 (ld.global.cg), never from a stale L1 line — so its
  // producer fills the ring and its consumers hold their first pass's metadata while the gate-up grid
  // drains; only the activations (the gate-up output) wait for it.
  if (kGateUp) pdl_wait();
  pdl_launch_dependents();
  const int units = p.K / kMoeUnitCols;
  const int spt = (units + kUnits - 1) / kUnits;  // stages per tile
  const int total = __ldcg(p.pass_total) * tiles;
  const int first = int(int64_t(blockIdx.x) * total / gridDim.x);
  const int last = int(int64_t(blockIdx.x + 1) * total / gridDim.x);
  const int nstages = (last - first) * spt;

  // Both roles walk the same sequence of stages (pass, tile, K stage) with running counters (no
  // divisions in the loops).
  int pass = first / tiles, tile = first % tiles, ks = 0, slot = 0;
  uint32_t phase = 0;
  auto advance = [&] {
    if (++slot == stages) slot = 0, phase ^= 1;
    if (++ks < spt) return;
    ks = 0;
    if (++tile == tiles) tile = 0, ++pass;
  };

  if (warp == kConsumerWarps) {
    if (lane != 0) return;
    int pass_loaded = -1;
    const uint8_t* wbase = nullptr;
    const uint8_t* sbase = nullptr;
    for (int st = 0; st < nstages; ++st, advance()) {
      if (st >= stages) mbar_wait(empty + 8 * slot, phase ^ 1);
      if (pass != pass_loaded) {
        const int expert = __ldcg(p.pass_expert + pass);
        pass_loaded = pass;
        wbase = p.weights + expert * p.expert_weight_bytes;
        sbase = p.scales + expert * p.expert_scale_bytes;
      }
      const int u0 = ks * kUnits, n = min(kUnits, units - u0);
      const size_t unit = size_t(tile) * units + u0;
      mbar_arrive_expect_tx(full + 8 * slot, n * (kMoeUnitBytes + kScaleBytes));
      bulk_copy_g2s(base + slot * kUnits * kMoeUnitBytes, wbase + unit * kMoeUnitBytes, n * kMoeUnitBytes,
                    full + 8 * slot);
      bulk_copy_g2s(base + off_scales + slot * kUnits * kScaleBytes, sbase + unit * kScaleBytes, n * kScaleBytes,
                    full + 8 * slot);
    }
    return;
  }

  const int g = lane / 4, q = lane % 4;
  // This lane's slice of unit j of a stage sits at + j · kConsumerWarps units from these.
  const uint32_t lane_w = base + warp * kMoeUnitBytes + lane * 16;
  const uint32_t lane_s = base + off_scales + warp * kScaleBytes + (F == MoeFp4Format::Nvfp4 ? 2 * lane : 4 * g + 2 * (q >> 1));
  const uint32_t my_part = base + off_partial + (warp * 32 + lane) * 16;
  // Per pass: rows, the pair of this lane's B column g (its activation row), the matrix factors.
  int pass_cur = -1, rows = 0, my_pair = -1;
  float fac0 = 0.f, fac1 = 0.f;
  auto load_pass = [&] {
    pass_cur = pass;
    rows = __ldcg(p.pass_rows + pass);
    const int begin = __ldcg(p.pass_begin + pass);
    my_pair = g < rows ? __ldcg(p.sorted_pairs + begin + g) : -1;
    const float* fac = p.factors + __ldcg(p.pass_expert + pass) * kFactorsPerExpert;
    fac0 = __ldg(fac + (kGateUp ? kGateFactor : kDownFactor));
    fac1 = __ldg(fac + (kGateUp ? kUpFactor : kDownFactor));
  };
  if (nstages > 0) load_pass();
  if (!kGateUp) pdl_wait();
  uint4 xb[UPS][2];
  float acc[2][4] = {};
  for (int st = 0, li = 0; st < nstages; ++st, advance()) {
    if (pass != pass_cur || spt > 1 || st == 0) {
      if (pass != pass_cur) load_pass();
      const __nv_bfloat16* row = my_pair >= 0 ? p.act + size_t(my_pair / p.act_row_divisor) * p.K + 16 * q : nullptr;
#pragma unroll
      for (int j = 0; j < UPS; ++j) {
        const int u = ks * kUnits + warp + kConsumerWarps * j;
        if (row && u < units) {
          const uint4* src = reinterpret_cast<const uint4*>(row + u * kMoeUnitCols);
          xb[j][0] = __ldg(src);
          xb[j][1] = __ldg(src + 1);
        } else {
          xb[j][0] = xb[j][1] = make_uint4(0, 0, 0, 0);
        }
      }
    }

    mbar_wait(full + 8 * slot, phase);
    const uint32_t stage_w = lane_w + slot * (kUnits * kMoeUnitBytes), stage_s = lane_s + slot * (kUnits * kScaleBytes);
#pragma unroll
    for (int j = 0; j < UPS; ++j) {
      if (units % kUnits == 0 || ks * kUnits + warp + kConsumerWarps * j < units) {
        const uint4 wq = ld_shared_v4(stage_w + j * kConsumerWarps * kMoeUnitBytes);
        const uint32_t sc = ld_shared_u16(stage_s + j * kConsumerWarps * kScaleBytes);
        // Two accumulators halve the dependent MMA chain per stage.
        mma_unit<F>(acc[j & 1], wq, sc, xb[j][0], xb[j][1]);
      }
    }
    // Every lane's ring loads have been consumed by its MMAs above, so the slot may be refilled.
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + 8 * slot);
    if (ks != spt - 1) continue;

    // End of the tile: park this warp's slice, and the round-robin warp reduces and stores.
    const int b = li & 1, use = li >> 1;
    const uint32_t part_off = b * kPartialBytes;
    if (use > 0) mbar_wait(freed + 8 * b, (use - 1) & 1);  // the reduction two tiles back has read it
    st_shared_v4f(my_part + part_off, make_float4(acc[0][0] + acc[1][0], acc[0][1] + acc[1][1],
                                                  acc[0][2] + acc[1][2], acc[0][3] + acc[1][3]));
    // The warp's 32 stores are ordered before lane 0's release-arrive by the warp barrier.
    __syncwarp();
    if (lane == 0) mbar_arrive(ready + 8 * b);
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[0][c] = acc[1][c] = 0.f;
    const bool reducer = warp == li % kConsumerWarps;
    ++li;
    if (!reducer) continue;
    mbar_wait(ready + 8 * b, use & 1);
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    const uint32_t part = base + off_partial + part_off + lane * 16;
#pragma unroll
    for (int w = 0; w < kConsumerWarps; ++w) {
      const float4 s = ld_shared_v4f(part + w * 32 * 16);
      v[0] += s.x, v[1] += s.y, v[2] += s.z, v[3] += s.w;
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(freed + 8 * b);
    // Columns 2q, 2q + 1 are the pairs of B columns (lanes with g =) 2q, 2q + 1.
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int pair = __shfl_sync(0xffffffffu, my_pair, (2 * q + c) * 4);
      if (2 * q + c < rows)
        store_fragment<kGateUp>(p, tile, g, pair, kGateUp ? __ldg(p.topk_weights + pair) : 0.f, fac0, fac1, v[c],
                                v[2 + c]);
    }
  }
#endif
}

// Units per consumer warp per stage: a whole tile per stage where K allows (K = 4096: 4, K = 2048: 2).
int units_per_warp(int K) {
  const int units = K / kMoeUnitCols;
  return units >= 4 * kConsumerWarps ? 4 : units >= 2 * kConsumerWarps ? 2 : 1;
}

// The ring takes as many stages as the block's shared memory allows (≤ kMaxStages); 0 if < 2 fit.
SmemLayout layout_for(MoeFp4Format f, int K, size_t optin) {
  const int stage_units = kConsumerWarps * units_per_warp(K), scale_bytes = moe_unit_scale_bytes(f);
  for (int stages = kMaxStages; stages >= 2; --stages) {
    SmemLayout l = smem_layout(stage_units, scale_bytes, stages);
    if (l.total <= optin) return l;
  }
  return SmemLayout{};
}

template <MoeFp4Format F, bool kGateUp, int UPS>
void launch(const GemmArgs& a, int rows, cudaStream_t stream) {
  static const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  const SmemLayout l = layout_for(F, a.K, current_device_limits().smem_per_block_optin);
  auto kernel = moe_fp4_stream_kernel<F, kGateUp, UPS>;
  allow_dynamic_smem(kernel, int(l.total));
  launch_programmatic(kernel, dim3(sms), dim3(kThreads), l.total, stream, a, rows / kMoeUnitRows, l.stages,
                      uint32_t(l.scales), uint32_t(l.partial), uint32_t(l.bars));
}

template <MoeFp4Format F, bool kGateUp>
void launch(const GemmArgs& a, int rows, cudaStream_t stream) {
  switch (units_per_warp(a.K)) {
    case 4: return launch<F, kGateUp, 4>(a, rows, stream);
    case 2: return launch<F, kGateUp, 2>(a, rows, stream);
    default: return launch<F, kGateUp, 1>(a, rows, stream);
  }
}

}  // namespace

bool moe_fp4_stream_fits(const MoeFp4Shape& shape, const DeviceLimits& limits) {
  return limits.cc_major >= 9 && layout_for(shape.format, shape.hidden, limits.smem_per_block_optin).stages >= 2 &&
         layout_for(shape.format, shape.inter, limits.smem_per_block_optin).stages >= 2;
}
KernelLaunch moe_fp4_stream_launch(MoeFp4Format format, bool gate_up, int K, const DeviceLimits& limits) {
  return {"moe_fp4_stream_kernel<" + format_template_arg(format) + (gate_up ? ", true, " : ", false, ") +
              std::to_string(units_per_warp(K)) + ">",
          kThreads, layout_for(format, K, limits.smem_per_block_optin).total};
}
void moe_fp4_stream_gemm(MoeFp4Format format, bool gate_up, const GemmArgs& a, int rows, cudaStream_t stream) {
  if (format == MoeFp4Format::Mxfp4) {
    if (gate_up) launch<MoeFp4Format::Mxfp4, true>(a, rows, stream);
    else launch<MoeFp4Format::Mxfp4, false>(a, rows, stream);
  } else {
    if (gate_up) launch<MoeFp4Format::Nvfp4, true>(a, rows, stream);
    else launch<MoeFp4Format::Nvfp4, false>(a, rows, stream);
  }
}

}  // namespace dsv4::cuda::moe_detail
