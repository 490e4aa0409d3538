// `dsv4 bench-ops persistent`: what a persistent decode-layer kernel would buy at one row, measured
// before one is built. At batch 1 a layer's replayed time is its weights' bytes at ~85% of the copy
// bandwidth plus stretches where one latency-bound kernel (the hyper-connection mixes, the norms,
// attention, the router) runs on a few SMs and HBM idles (docs/perf/2026-12-05-producer-codes.md:
// ~60 of a SWA layer's ~162 µs on an H100). A kernel chain cannot read the next weights during those
// stretches (an L2 prefetch beside them lost, docs/perf/2026-12-03-l2-prefetch.md); a resident kernel
// could hold them in shared memory. This benchmark runs each layer kind (SWA, CSA, HCA) — its latency
// stretches as one block busy for the traced time, each followed by the bytes the trace reads after
// it — three ways over the same bytes, then projects DeepSeek-V4-Flash's 43 layers from them:
//  - chain: a kernel per piece, programmatic launches, one CUDA graph (the engine's structure today);
//  - persistent: one resident kernel (a block per SM, cooperative launch), a grid barrier after each
//    piece (the latency stage needs the whole output before it, the weights the stage's result);
//  - prefetched: the persistent form where, during each latency stretch, every block bulk-copies the
//    start of its slice of the next weights into its shared memory and reads the rest after the barrier.
// The weight "work" sums the bytes (one dp4a per 4): the question is the memory system's, not the
// MMA's. Bounds in the same table: Σ latency + bytes / copy (nothing overlaps) and
// max(Σ latency, bytes / copy) (everything does). Four layers of distinct weights (~1 GB) rotate, so
// L2 holds none of them from one layer to the next.
#include <fmt/core.h>

#include <algorithm>
#include <cuda/atomic>
#include <string>
#include <vector>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/ptx_primitives.cuh"
#include "bench/bench_utils.h"
#include "bench/op_benchmarks.h"

namespace dsv4::bench {
namespace {

using cuda::DeviceBuffer;
using cuda::bulk_copy_g2s;
using cuda::fence_mbar_init;
using cuda::mbar_arrive_expect_tx;
using cuda::mbar_init;
using cuda::mbar_wait;
using cuda::smem_u32;

constexpr int kThreads = 1024;   // a block per SM; 6 loads of 16 bytes in flight a thread = 96 KB per SM
constexpr int kUnroll = 6;
constexpr int kMaxPieces = 8;
constexpr int kLayers = 4;       // distinct weights per pass (rotation past L2)
constexpr int kPasses = 5;
constexpr uint32_t kCopyPiece = 32768;  // bytes per bulk copy

// One latency stretch (µs of one busy block) and the weights read after it.
struct Piece {
  double latency_us;
  double megabytes;
};
// The three layer kinds at one row on an H100 (the 3d5a872 trace of
// docs/perf/2026-12-05-producer-codes.md, run 4, layers 1–3): the µs from the end of one
// weight-reading kernel to the start of streaming in the next, and the MB each group reads. Stretches:
// hc_post + hc_pre; q's norm; (CSA: the indexer's chain) head norm + RoPE, attention, inverse RoPE;
// act_quant; hc_post + hc_pre, gate and top-k (the shared expert's w1/w3 streams beside them);
// the SwiGLU rounding; the combine. Weights after them: wq_a + wkv (+ the compressors' projections),
// wq_b (+ the indexer's), wo_a, wo_b, the experts' gate-up (6 routed MXFP4 + the shared FP8), their down.
struct LayerKind {
  const char* name;
  int in_flash;  // layers of this kind in DeepSeek-V4-Flash's 43
  int count;
  Piece piece[kMaxPieces];
};
constexpr LayerKind kKinds[] = {
    {"SWA", 2, 7, {{11.0, 6.29}, {2.5, 33.55}, {21.0, 67.11}, {1.5, 33.55}, {19.0, 68.7}, {2.0, 33.6}, {4.5, 0}}},
    {"CSA", 21, 7, {{11.0, 23.1}, {3.6, 41.95}, {53.6, 67.11}, {1.2, 33.55}, {19.0, 68.7}, {1.8, 33.6}, {4.4, 0}}},
    {"HCA", 20, 7, {{11.0, 14.7}, {4.8, 33.55}, {28.8, 67.11}, {1.1, 33.55}, {20.0, 68.7}, {2.1, 33.6}, {3.7, 0}}},
};

struct DevicePiece {
  long long busy_cycles;
  size_t offset, bytes;  // of the layer's weights (multiples of 16)
};
struct DeviceLayer {
  DevicePiece piece[kMaxPieces];
  int count;
  size_t bytes;  // a whole layer's weights
};

__device__ __forceinline__ void busy(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

__device__ __forceinline__ uint32_t byte_sum(const uint4& v, uint32_t acc) {
  acc = __dp4a(v.x, 0x01010101u, acc);
  acc = __dp4a(v.y, 0x01010101u, acc);
  acc = __dp4a(v.z, 0x01010101u, acc);
  return __dp4a(v.w, 0x01010101u, acc);
}

// Block b's part of a piece: [begin, end) of its bytes, 16-byte aligned.
struct Slice {
  size_t begin, end;
};
__device__ __forceinline__ Slice slice_of(size_t bytes, int block, int blocks) {
  const size_t per = ((bytes + blocks - 1) / blocks + 15) / 16 * 16;
  const size_t begin = size_t(block) * per < bytes ? size_t(block) * per : bytes;
  return {begin, begin + per < bytes ? begin + per : bytes};
}

// The bytes [begin, end) of w read by the block, kUnroll 16-byte loads in flight a thread. (Not
// inlined: every form reads through this same code; inlined into the chain's kernel, ptxas spilled it
// on sm_120a at 64 registers.)
__device__ __noinline__ uint32_t stream_sum(const uint8_t* w, size_t begin, size_t end, uint32_t acc) {
  const uint4* p = reinterpret_cast<const uint4*>(w);
  size_t i = begin / 16 + threadIdx.x;
  const size_t n = end / 16;
  for (; i + size_t(kUnroll - 1) * blockDim.x < n; i += size_t(kUnroll) * blockDim.x) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(p + i + size_t(u) * blockDim.x);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc = byte_sum(v[u], acc);
  }
  for (; i < n; i += blockDim.x) acc = byte_sum(__ldg(p + i), acc);
  return acc;
}

// The block's sum into sink (read back, so nothing is optimised away): a warp's sum first, so that
// the chain's kernels end with 32 shared atomics, not 1024 on one word.
__device__ void publish(uint32_t acc, uint32_t* sink) {
  __shared__ uint32_t total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  acc = __reduce_add_sync(0xffffffffu, acc);
  if (threadIdx.x % 32 == 0) atomicAdd(&total, acc);
  __syncthreads();
  if (threadIdx.x == 0) sink[blockIdx.x] += total;
}

// ---- the chain: a kernel per piece ---------------------------------------------------------------

__global__ void latency_kernel(long long cycles) {
  cuda::pdl_wait();
  cuda::pdl_launch_dependents();
  if (threadIdx.x == 0) busy(cycles);
}

__global__ void __launch_bounds__(kThreads, 1) weights_kernel(const uint8_t* w, size_t bytes, uint32_t* sink) {
  cuda::pdl_wait();
  cuda::pdl_launch_dependents();
  const Slice s = slice_of(bytes, blockIdx.x, gridDim.x);
  publish(stream_sum(w, s.begin, s.end, 0), sink);
}

// ---- the persistent forms ----------------------------------------------------------------------

// All blocks of the (co-resident) grid meet: bar[0] counts arrivals, bar[1] is the generation.
__device__ void grid_barrier(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    ::cuda::atomic_ref<unsigned, ::cuda::thread_scope_device> count(bar[0]), generation(bar[1]);
    const unsigned g = generation.load(::cuda::memory_order_relaxed);
    if (count.fetch_add(1, ::cuda::memory_order_acq_rel) == gridDim.x - 1) {
      count.store(0, ::cuda::memory_order_relaxed);
      generation.store(g + 1, ::cuda::memory_order_release);
    } else {
      while (generation.load(::cuda::memory_order_acquire) == g) {
      }
    }
  }
  __syncthreads();
}

template <bool kPrefetch>
__global__ void __launch_bounds__(kThreads, 1)
    persistent_kernel(const uint8_t* weights, int layers, int passes, DeviceLayer layer, uint32_t smem_bytes,
                      unsigned* bar, uint32_t* sink) {
  extern __shared__ __align__(128) uint8_t ahead[];
  __shared__ __align__(8) uint64_t landed;
  const uint32_t landed_at = smem_u32(&landed);
  if constexpr (kPrefetch) {
    if (threadIdx.x == 0) {
      mbar_init(landed_at, 1);
      fence_mbar_init();
    }
    __syncthreads();
  }
  uint32_t acc = 0, parity = 0;
  for (int pass = 0; pass < passes; ++pass)
    for (int l = 0; l < layers; ++l) {
      const uint8_t* w = weights + size_t(l) * layer.bytes;
      for (int i = 0; i < layer.count; ++i) {
        const DevicePiece pc = layer.piece[i];
        const Slice s = slice_of(pc.bytes, blockIdx.x, gridDim.x);
        const uint32_t held = !kPrefetch ? 0 : s.end - s.begin < smem_bytes ? uint32_t(s.end - s.begin) : smem_bytes;
        // The latency stretch: the start of this block's next weights on their way to shared memory
        // while block 0 is busy (every block waits at the barrier for it).
        if constexpr (kPrefetch)
          if (held && threadIdx.x == 0) {
            mbar_arrive_expect_tx(landed_at, held);
            for (uint32_t off = 0; off < held; off += kCopyPiece)
              bulk_copy_g2s(smem_u32(ahead + off), w + pc.offset + s.begin + off,
                            held - off < kCopyPiece ? held - off : kCopyPiece, landed_at);
          }
        if (blockIdx.x == 0 && threadIdx.x == 0) busy(pc.busy_cycles);
        grid_barrier(bar);
        if constexpr (kPrefetch)
          if (held) {
            mbar_wait(landed_at, parity);
            parity ^= 1;
            const uint4* v = reinterpret_cast<const uint4*>(ahead);
            for (uint32_t k = threadIdx.x; k < held / 16; k += blockDim.x) acc = byte_sum(v[k], acc);
          }
        acc = stream_sum(w + pc.offset, s.begin + held, s.end, acc);
        grid_barrier(bar);  // (also: every thread is done with `ahead` before the next copy into it)
      }
    }
  publish(acc, sink);
}

}  // namespace

void bench_persistent_layer() {
  int device = 0, sms = 0, clock_khz = 0, optin = 0, cooperative = 0;
  DSV4_CUDA_CHECK(cudaGetDevice(&device));
  DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
  DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device));
  cudaDeviceProp prop{};
  DSV4_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const double copy_gbs = measure_copy_bandwidth_gbs();
  fmt::print("# bench-ops persistent\n\n{} ({} SMs, SM clock {:.0f} MHz as reported), device-to-device copy {:.0f} GB/s "
             "(read + write)\n\n",
             prop.name, sms, clock_khz / 1e3, copy_gbs);
  if (!cooperative) fail("bench-ops persistent: this GPU has no cooperative launch (the persistent forms need one)");

  // A layer's pieces at the traced sizes; `weights` / `latency` false zero them (the calibration rows).
  const auto make_layer = [&](const LayerKind& kind, bool latency, bool weights) {
    DeviceLayer d{};
    d.count = kind.count;
    size_t offset = 0;
    for (int i = 0; i < kind.count; ++i) {
      const size_t bytes = weights ? size_t(kind.piece[i].megabytes * 1e6) / 16 * 16 : 0;
      // (clock64 counts SM cycles at the running clock; the reported clock is the maximum, so a busy
      // stretch may run longer where the clock is lower: the "latency only" rows measure it.)
      d.piece[i] = {latency ? (long long)(kind.piece[i].latency_us * clock_khz * 1e-3) : 0, offset, bytes};
      offset += (bytes + 4095) / 4096 * 4096;
    }
    d.bytes = std::max<size_t>(offset, 4096);
    return d;
  };
  size_t most_bytes = 0;
  for (const LayerKind& k : kKinds) most_bytes = std::max(most_bytes, make_layer(k, true, true).bytes);

  DeviceBuffer<uint8_t> weights(most_bytes * kLayers);
  weights.fill_bytes(3);
  DeviceBuffer<uint32_t> sink{size_t(sms)};
  sink.fill_bytes(0);
  DeviceBuffer<unsigned> bar(2);
  bar.fill_bytes(0);
  cuda::Stream stream;
  cuda::Event start, stop;

  const auto chain = [&](const DeviceLayer& layer) {
    cuda::Graph graph;
    graph.capture(stream.get(), [&](cudaStream_t s) {
      for (int l = 0; l < kLayers; ++l)
        for (int i = 0; i < layer.count; ++i) {
          const DevicePiece& pc = layer.piece[i];
          cuda::launch_programmatic(latency_kernel, dim3(1), dim3(32), 0, s, pc.busy_cycles);
          if (pc.bytes)
            cuda::launch_programmatic(weights_kernel, dim3(unsigned(sms)), dim3(kThreads), 0, s,
                                      weights.get() + size_t(l) * layer.bytes + pc.offset, pc.bytes, sink.get());
        }
    });
    graph.launch(stream.get());  // (warm-up)
    start.record(stream.get());
    for (int p = 0; p < kPasses; ++p) graph.launch(stream.get());
    stop.record(stream.get());
    return double(stop.elapsed_ms_since(start)) * 1e3 / (kPasses * kLayers);
  };

  // Shared memory for the prefetched form: what one block may have, less the kernel's static part.
  const uint32_t smem_bytes = uint32_t(std::max(0, optin - 1024)) / kCopyPiece * kCopyPiece;
  const auto persistent = [&](const DeviceLayer& layer, bool prefetch) {
    auto kernel = prefetch ? persistent_kernel<true> : persistent_kernel<false>;
    const uint32_t smem = prefetch ? smem_bytes : 0;
    DSV4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int per_sm = 0;
    DSV4_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
    if (per_sm < 1) fail("bench-ops persistent: a {}-thread block with {} B of shared memory does not fit an SM", kThreads, smem);
    const uint8_t* w = weights.get();
    int layers = kLayers, passes = 1;
    uint32_t smem_arg = smem;
    unsigned* bar_arg = bar.get();
    uint32_t* sink_arg = sink.get();
    DeviceLayer layer_arg = layer;
    void* args[] = {&w, &layers, &passes, &layer_arg, &smem_arg, &bar_arg, &sink_arg};
    const auto launch = [&] {
      DSV4_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(kernel), dim3(unsigned(sms)),
                                                  dim3(kThreads), args, smem, stream.get()));
    };
    launch();  // (warm-up, one pass)
    passes = kPasses;
    start.record(stream.get());
    launch();
    stop.record(stream.get());
    return double(stop.elapsed_ms_since(start)) * 1e3 / (kPasses * kLayers);
  };

  // Per kind: the forms' µs per layer; then DeepSeek-V4-Flash's 43 layers from them.
  struct Times {
    double chain, persistent, prefetched, serial, overlapped;
  };
  Times step{};
  double step_mb = 0;
  for (const LayerKind& kind : kKinds) {
    const DeviceLayer full = make_layer(kind, true, true), latency_only = make_layer(kind, true, false),
                      weights_only = make_layer(kind, false, true);
    double layer_mb = 0, latency_us = 0;
    for (int i = 0; i < kind.count; ++i) layer_mb += kind.piece[i].megabytes, latency_us += kind.piece[i].latency_us;
    const double chain_latency = chain(latency_only), chain_weights = chain(weights_only), chain_full = chain(full);
    const double pers_latency = persistent(latency_only, false), pers_weights = persistent(weights_only, false),
                 pers_full = persistent(full, false), pref_full = persistent(full, true);
    const double copy_us = layer_mb * 1e3 / copy_gbs;
    const Times t{chain_full, pers_full, pref_full, latency_us + copy_us, std::max(latency_us, copy_us)};
    step.chain += kind.in_flash * t.chain, step.persistent += kind.in_flash * t.persistent;
    step.prefetched += kind.in_flash * t.prefetched, step.serial += kind.in_flash * t.serial;
    step.overlapped += kind.in_flash * t.overlapped, step_mb += kind.in_flash * layer_mb;

    Table table({"form", "pieces", "µs per layer", "weights GB/s", "% of copy", "vs chain"});
    const auto row = [&](const std::string& form, const std::string& pieces, double us, bool bytes, double vs) {
      const double gbs = layer_mb * 1e3 / us;
      table.add({form, pieces, fmt::format("{:.1f}", us), bytes ? fmt::format("{:.0f}", gbs) : "",
                 bytes ? fmt::format("{:.1f}", 100 * gbs / copy_gbs) : "", vs > 0 ? fmt::format("{:.2f}×", vs / us) : ""});
    };
    row("chain", "latency only", chain_latency, false, 0);
    row("chain", "weights only", chain_weights, true, 0);
    row("chain", "both", chain_full, true, 0);
    row("persistent", "latency only", pers_latency, false, 0);
    row("persistent", "weights only", pers_weights, true, 0);
    row("persistent", "both", pers_full, true, chain_full);
    row(fmt::format("prefetched ({} KB of shared memory a block)", smem_bytes / 1024), "both", pref_full, true, chain_full);
    row("bound: nothing overlaps (Σ latency + bytes at copy speed)", "both", t.serial, true, chain_full);
    row("bound: everything overlaps (the larger of the two)", "both", t.overlapped, true, chain_full);
    table.print(fmt::format("{} layer at one row: {} latency stretches ({:.1f} µs as traced on an H100), {:.1f} MB of weights",
                            kind.name, kind.count, latency_us, layer_mb));
  }
  (void)sink.download(stream.get());

  Table total({"form", "43 layers, µs", "weights GB/s", "% of copy", "vs chain"});
  const auto total_row = [&](const std::string& form, double us) {
    const double gbs = step_mb * 1e3 / us;
    total.add({form, fmt::format("{:.0f}", us), fmt::format("{:.0f}", gbs), fmt::format("{:.1f}", 100 * gbs / copy_gbs),
               fmt::format("{:.2f}×", step.chain / us)});
  };
  total_row("chain", step.chain);
  total_row("persistent", step.persistent);
  total_row("prefetched", step.prefetched);
  total_row("bound: nothing overlaps", step.serial);
  total_row("bound: everything overlaps", step.overlapped);
  std::string mix;
  for (const LayerKind& k : kKinds) mix += fmt::format("{}{} {}", mix.empty() ? "" : " + ", k.in_flash, k.name);
  total.print(fmt::format("DeepSeek-V4-Flash's layers ({}; no embedding or head)", mix));
}

}  // namespace dsv4::bench
