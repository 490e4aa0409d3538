// Streaming decode GEMM of the FP4 MoE (W4A16, SPEC.md §3.7): the expert GEMMs at a few tokens per
// expert, where the time should be the bytes of the packed weights. The register decode kernel keeps
// its loads in registers (4 KB per warp) and the window empties at every K-reduction barrier; here the
// packed weights and scales flow through a 128 KB shared-memory ring filled with 16-byte cp.async.cg
// copies, so ~96 KB per SM stay in flight whatever the compute, the reductions and the epilogues do.
// (cp.async.cg runs on sm_80 and later, so the kernel is the same on sm_90a and sm_120a; the L2
// cache-hinted form is avoided, it faulted on sm_90a with nvcc 13.0.)
// Measured on the H200 it is slower than the register kernel (docs/perf/moe_fp4.md: its consumer loop,
// not memory, is the limit), so the dispatcher does not pick it; it runs when forced and is tested.
//
// Work is a flat list of items (pass, 16-row weight tile); a pass is ≤ 8 rows (tokens) of one expert,
// listed by moe_route_pairs(). One block per SM takes a contiguous range of items, so that even one
// token (6 experts × 256 tiles) spreads evenly over every SM without splitting K across blocks. A
// stage is a whole tile where K allows (16 warps × UPS units); each warp accumulates its K slice in
// registers, and at the tile's end the 16 slices are reduced through shared memory by one warp
// (round-robin) while the others already compute the next tile. The pass's activation rows and
// epilogue metadata are staged in shared memory when the pass changes.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/moe_fp4_kernels.cuh"
#include "core/error.h"

namespace dsv4::cuda::moe_detail {
namespace {

constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kRingBytes = 128 * 1024;  // packed weights in the ring; all stages but one are in flight
constexpr int kPartialFloats = kWarps * 4 * 32;
// The down GEMM is launched as a programmatic dependent of the gate-up GEMM: its blocks start as the
// gate-up blocks leave their SMs and fill their weight rings (which do not depend on the gate-up
// output) before waiting for the gate-up grid to finish.
constexpr bool kProgrammaticDown = true;

// UPS: units per warp per stage. A stage is kWarps · UPS units of one tile (ideally the whole tile:
// one block barrier and one reduction per tile), and the ring holds kRingBytes of them.
template <int UPS>
struct Stage {
  static constexpr int kUnits = kWarps * UPS;
  static constexpr int kBytes = kUnits * kMoeUnitBytes;
  static constexpr int kCount = kRingBytes / kBytes;
};

// Per pass (double-buffered by pass parity: the reduction of the previous pass's last tile may run
// while the next pass is being staged): pair ids, routing weights, the two matrix factors.
struct PassMeta {
  int pair[2][kMoeMaxPassRows];
  float weight[2][kMoeMaxPassRows];
  float factor[2][2];
};

struct SmemLayout {
  size_t scales, partial, meta, xs, total;
};
__host__ __device__ inline SmemLayout smem_layout(int stage_units, int stages, int scale_bytes, int xs_rows, int K) {
  SmemLayout l{};
  l.scales = size_t(stages) * stage_units * kMoeUnitBytes;
  l.partial = l.scales + size_t(stages) * stage_units * scale_bytes;
  l.meta = l.partial + 2 * kPartialFloats * sizeof(float);
  l.xs = l.meta + (sizeof(PassMeta) + 15) / 16 * 16;
  l.total = l.xs + size_t(xs_rows) * (K + 8) * sizeof(__nv_bfloat16);
  return l;
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <MoeFp4Format F, bool kGateUp, int UPS>
__global__ void __launch_bounds__(kThreads, 1) moe_fp4_stream_kernel(GemmArgs p, int tiles, int xs_rows) {
  using S = Stage<UPS>;
  constexpr int kScaleBytes = moe_unit_scale_bytes(F);
  constexpr int kScaleCopies = S::kUnits * kScaleBytes / 16;
  static_assert(kScaleCopies <= kThreads, "one scale copy per thread");
  extern __shared__ __align__(16) uint8_t smem[];
  const SmemLayout layout = smem_layout(S::kUnits, S::kCount, kScaleBytes, xs_rows, p.K);
  const uint8_t* ring_w = smem;
  const uint8_t* ring_s = smem + layout.scales;
  float* partial = reinterpret_cast<float*>(smem + layout.partial);  // [2 tiles][warp][4][32]
  PassMeta& meta = *reinterpret_cast<PassMeta*>(smem + layout.meta);
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem + layout.xs);
  const int xstride = p.K + 8;  // bf16 elements; +16 bytes puts the 8 rows in distinct bank quads

  const int units = p.K / kMoeUnitCols;
  const int spt = (units + S::kUnits - 1) / S::kUnits;  // stages per tile
  const int total = *p.pass_total * tiles;
  const int first = int(int64_t(blockIdx.x) * total / gridDim.x);
  const int last = int(int64_t(blockIdx.x + 1) * total / gridDim.x);
  if (first >= last) return;
  const int nstages = (last - first) * spt;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;

  // Loader: copy j of thread (warp, lane) is lane's 16 bytes of the stage's unit warp + kWarps·j (the
  // unit this warp computes on); the first kScaleCopies threads copy the stage's scales. Every stage
  // commits one group, possibly empty.
  const uint32_t ring_w_addr = uint32_t(__cvta_generic_to_shared(ring_w)) + tid * 16;
  const uint32_t ring_s_addr = uint32_t(__cvta_generic_to_shared(ring_s)) + tid * 16;
  int load_pass = -1;
  const uint8_t* load_w = nullptr;
  const uint8_t* load_s = nullptr;
  auto issue = [&](int st) {
    if (st < nstages) {
      const int item = first + st / spt, ks = st % spt;
      const int pass = item / tiles, tile = item % tiles;
      if (pass != load_pass) {
        const int expert = __ldg(p.pass_expert + pass);
        load_pass = pass;
        load_w = p.weights + expert * p.expert_weight_bytes;
        load_s = p.scales + expert * p.expert_scale_bytes;
      }
      const int slot = st % S::kCount;
      const size_t unit0 = size_t(tile) * units + ks * S::kUnits;
#pragma unroll
      for (int j = 0; j < UPS; ++j)
        if (ks * S::kUnits + warp + kWarps * j < units)
          cp_async16(ring_w_addr + slot * S::kBytes + j * kThreads * 16,
                     load_w + (unit0 + warp + kWarps * j) * kMoeUnitBytes + lane * 16);
      if (tid < kScaleCopies && ks * S::kUnits + tid * 16 / kScaleBytes < units)
        cp_async16(ring_s_addr + slot * S::kUnits * kScaleBytes, load_s + unit0 * kScaleBytes + tid * 16);
    }
    cp_async_commit();
  };

  // Reduction of local item li's kWarps K slices and its epilogue, by one warp.
  auto epilogue = [&](int li) {
    const int item = first + li, pass = item / tiles, tile = item % tiles, m = pass & 1;
    const float* part = partial + (li & 1) * kPartialFloats;
    float v[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += part[(w * 4 + c) * 32 + lane];
      v[c] = s;
    }
    const int prows = __ldg(p.pass_rows + pass);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int r = 2 * q + c;
      if (r >= prows) continue;
      store_fragment<kGateUp>(p, tile, g, meta.pair[m][r], meta.weight[m][r], meta.factor[m][0], meta.factor[m][1],
                              v[c], v[2 + c]);
    }
  };

  for (int st = 0; st < S::kCount - 1; ++st) issue(st);
  // The routing lists were complete before the gate-up grid started; only the activations (the
  // gate-up output, for the down GEMM) need the previous grid to have finished.
  if (kGateUp) pdl_launch_dependents();
  else pdl_wait();
  const int scale_offset = F == MoeFp4Format::Nvfp4 ? 2 * lane : 4 * g + 2 * (q >> 1);
  int xs_pass = -1, rows = 0;
  float acc[2][4] = {};
  for (int st = 0; st < nstages; ++st) {
    cp_async_wait<S::kCount - 2>();
    // Stage st has landed (every thread's copies), and every warp is done with stage st - 1, whose
    // slot the next copies overwrite, and has written its slice of any tile that ended there.
    __syncthreads();
    issue(st + S::kCount - 1);
    const int li = st / spt, ks = st % spt;
    if (ks == 0 && li > 0 && warp == (li - 1) % kWarps) epilogue(li - 1);
    const int pass = (first + li) / tiles;
    if (pass != xs_pass) {
      xs_pass = pass;
      rows = __ldg(p.pass_rows + pass);
      const int begin = __ldg(p.pass_begin + pass), vec_per_row = p.K / 8;
      for (int v = tid; v < rows * vec_per_row; v += kThreads) {
        const int r = v / vec_per_row, c = v % vec_per_row;
        const int pair = __ldg(p.sorted_pairs + begin + r);
        const uint4* src = reinterpret_cast<const uint4*>(p.act + size_t(pair / p.act_row_divisor) * p.K) + c;
        *reinterpret_cast<uint4*>(xs + r * xstride + c * 8) = __ldg(src);
      }
      if (tid < rows) {
        const int pair = __ldg(p.sorted_pairs + begin + tid);
        meta.pair[pass & 1][tid] = pair;
        meta.weight[pass & 1][tid] = kGateUp ? __ldg(p.topk_weights + pair) : 0.f;
      }
      if (tid == kThreads - 1) {
        const float* fac = p.factors + __ldg(p.pass_expert + pass) * kFactorsPerExpert;
        meta.factor[pass & 1][0] = kGateUp ? __ldg(fac + kGateFactor) : __ldg(fac + kDownFactor);
        meta.factor[pass & 1][1] = kGateUp ? __ldg(fac + kUpFactor) : __ldg(fac + kDownFactor);
      }
      __syncthreads();
    }
    const int slot = st % S::kCount;
#pragma unroll
    for (int j = 0; j < UPS; ++j) {
      const int su = warp + kWarps * j, u = ks * S::kUnits + su;
      if (u < units) {
        const uint4 wq = *reinterpret_cast<const uint4*>(ring_w + slot * S::kBytes + su * kMoeUnitBytes + lane * 16);
        const uint32_t sc = *reinterpret_cast<const unsigned short*>(ring_s + (slot * S::kUnits + su) * kScaleBytes +
                                                                     scale_offset);
        uint4 xb0 = make_uint4(0, 0, 0, 0), xb1 = xb0;
        if (g < rows) {
          const uint4* src = reinterpret_cast<const uint4*>(xs + g * xstride + u * kMoeUnitCols + 16 * q);
          xb0 = src[0];
          xb1 = src[1];
        }
        // Two accumulators halve the dependent MMA chain per stage.
        mma_unit<F>(acc[j & 1], wq, sc, xb0, xb1);
      }
    }
    if (ks == spt - 1) {
      float* part = partial + ((li & 1) * kWarps + warp) * 128;
#pragma unroll
      for (int c = 0; c < 4; ++c) part[c * 32 + lane] = acc[0][c] + acc[1][c], acc[0][c] = acc[1][c] = 0.f;
    }
  }
  __syncthreads();
  const int items = last - first;
  if (warp == (items - 1) % kWarps) epilogue(items - 1);
}

int device_attribute(cudaDeviceAttr attr) {
  int device = 0, v = 0;
  DSV4_CUDA_CHECK(cudaGetDevice(&device));
  DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, device));
  return v;
}

// Units per warp per stage: a whole tile per stage where K allows (K = 4096: 4, K = 2048: 2).
int units_per_warp(int K) {
  const int units = K / kMoeUnitCols;
  return units >= 4 * kWarps ? 4 : units >= 2 * kWarps ? 2 : 1;
}

template <int UPS>
size_t smem_bytes(MoeFp4Format f, int xs_rows, int K) {
  return smem_layout(Stage<UPS>::kUnits, Stage<UPS>::kCount, moe_unit_scale_bytes(f), xs_rows, K).total;
}
size_t smem_bytes(MoeFp4Format f, int xs_rows, int K) {
  switch (units_per_warp(K)) {
    case 4: return smem_bytes<4>(f, xs_rows, K);
    case 2: return smem_bytes<2>(f, xs_rows, K);
    default: return smem_bytes<1>(f, xs_rows, K);
  }
}

template <MoeFp4Format F, bool kGateUp, int UPS>
void launch(const GemmArgs& a, int rows, int tokens, cudaStream_t stream) {
  static const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  static size_t raised = 0;  // per instantiation: the limit is an attribute of the function
  const int xs_rows = std::min(kMoeMaxPassRows, tokens);
  const size_t smem = smem_bytes<UPS>(F, xs_rows, a.K);
  auto kernel = moe_fp4_stream_kernel<F, kGateUp, UPS>;
  if (smem > raised) {
    DSV4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    raised = smem;
  }
  if (!kGateUp && kProgrammaticDown) {
    launch_programmatic(kernel, dim3(sms), dim3(kThreads), smem, stream, a, rows / kMoeUnitRows, xs_rows);
  } else {
    kernel<<<sms, kThreads, smem, stream>>>(a, rows / kMoeUnitRows, xs_rows);
    DSV4_CUDA_CHECK_LAUNCH();
  }
}

template <MoeFp4Format F, bool kGateUp>
void launch(const GemmArgs& a, int rows, int tokens, cudaStream_t stream) {
  switch (units_per_warp(a.K)) {
    case 4: return launch<F, kGateUp, 4>(a, rows, tokens, stream);
    case 2: return launch<F, kGateUp, 2>(a, rows, tokens, stream);
    default: return launch<F, kGateUp, 1>(a, rows, tokens, stream);
  }
}

}  // namespace

bool moe_fp4_stream_fits(const MoeFp4Shape& shape, int tokens) {
  static const int optin = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  const int xs_rows = std::min(kMoeMaxPassRows, std::max(tokens, 1));
  return smem_bytes(shape.format, xs_rows, shape.hidden) <= size_t(optin) &&
         smem_bytes(shape.format, xs_rows, shape.inter) <= size_t(optin);
}
void moe_fp4_stream_gemm(MoeFp4Format format, bool gate_up, const GemmArgs& a, int rows, int tokens,
                         cudaStream_t stream) {
  if (format == MoeFp4Format::Mxfp4) {
    if (gate_up) launch<MoeFp4Format::Mxfp4, true>(a, rows, tokens, stream);
    else launch<MoeFp4Format::Mxfp4, false>(a, rows, tokens, stream);
  } else {
    if (gate_up) launch<MoeFp4Format::Nvfp4, true>(a, rows, tokens, stream);
    else launch<MoeFp4Format::Nvfp4, false>(a, rows, tokens, stream);
  }
}

}  // namespace dsv4::cuda::moe_detail
