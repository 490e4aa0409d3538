// `dsv4 bench-ops chain`: what one link of a decode step's kernel chain costs, and how much of it is
// fetching the kernel's instructions. At batch 1 a layer is ~20 dependent programmatic launches, most
// of them latency-bound (docs/perf/2026-12-05-persistent-layer-bench.md), and their code is large: in
// sm_90a cubins the hyper-connection kernel is ~90 KB of SASS, attention ~60 KB, the router's top-k
// and grouping ~37 KB, the MoE combine ~35 KB. A step runs ~25 such kernels once each, far more code
// than an SM's instruction caches hold, and the weights streaming between them pass through L2. So
// each kernel may start cold and fetch its instructions as it runs. This benchmark separates that
// from the launch itself: chains of 64 dependent launches of one warp each (a programmatic wait, one
// load of what the link before wrote, a straight-line body of independent FMAs, one store), with
//  - the same kernel in every link (its code stays in the SM's caches after the first) or 16
//    distinct kernels of the same size in turn (16 × the code: cold in every link);
//  - bodies of 0, 1024 and 2048 FMAs (~0, ~16 and ~32 KB of code);
//  - optionally, between links, a kernel on every SM reading 96 MB (more than L2), as the weight reads
//    between a step's latency-bound kernels do: then a cold kernel's code comes from HBM.
// µs per link = the replayed chain / 64; "fetch" = distinct − same at the same body.
#include <fmt/core.h>

#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/ptx_primitives.cuh"
#include "bench/bench_utils.h"
#include "bench/op_benchmarks.h"

namespace dsv4::bench {
namespace {

using cuda::DeviceBuffer;

constexpr int kLinks = 64;
constexpr int kKinds = 16;                 // distinct kernels of one body size
constexpr size_t kEvictBytes = 96u << 20;  // read between links: more than the 50 MB L2

// One link: wait for the link before, read what it wrote, a body of kBody FMAs (distinct constants per
// kId, so each instance is its own code), write for the next link.
template <int kId, int kBody>
__global__ void __launch_bounds__(32) link_kernel(float* buf) {
  cuda::pdl_wait();
  cuda::pdl_launch_dependents();
  float a[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) a[j] = buf[threadIdx.x * 8 + j];
#pragma unroll
  for (int i = 0; i < kBody; ++i) a[i % 8] = fmaf(a[i % 8], 1.0f + float(i + kId * 4099) * 1e-9f, 1e-6f);
#pragma unroll
  for (int j = 0; j < 8; ++j) buf[threadIdx.x * 8 + j] = a[j];
}

// Every SM reads its share of `bytes` (16-byte loads) and keeps a sum no one reads unless it is 0.
__global__ void evict_kernel(const uint4* __restrict__ p, size_t n, uint32_t* sink) {
  cuda::pdl_wait();
  cuda::pdl_launch_dependents();
  uint32_t s = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(p + i);
    s += v.x ^ v.y ^ v.z ^ v.w;
  }
  if (s == 0x12345678u) sink[0] = s;
}

using LinkFn = void (*)(float*);

template <int kBody, int... kIds>
std::vector<LinkFn> kernels_of(std::integer_sequence<int, kIds...>) {
  return {link_kernel<kIds, kBody>...};
}
template <int kBody>
std::vector<LinkFn> kernels() {
  return kernels_of<kBody>(std::make_integer_sequence<int, kKinds>{});
}

}  // namespace

void bench_launch_chain() {
  int device = 0, sms = 0;
  DSV4_CUDA_CHECK(cudaGetDevice(&device));
  DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  cudaDeviceProp prop{};
  DSV4_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  fmt::print("# bench-ops chain\n\n{} ({} SMs): {} dependent programmatic launches of one warp per chain, one "
             "CUDA graph; µs per link = median replay / {}\n\n",
             prop.name, sms, kLinks, kLinks);

  DeviceBuffer<float> buf(256);
  buf.fill_bytes(0);
  DeviceBuffer<uint8_t> evict(kEvictBytes);
  evict.fill_bytes(1);
  DeviceBuffer<uint32_t> sink(1);
  const std::pair<int, std::vector<LinkFn>> bodies[] = {{0, kernels<0>()}, {1024, kernels<1024>()},
                                                        {2048, kernels<2048>()}};

  const auto per_link = [&](const std::vector<LinkFn>& fns, bool distinct, bool evicting) {
    const auto chain = [&](int, cudaStream_t s) {
      for (int l = 0; l < kLinks; ++l) {
        cuda::launch_programmatic(fns[distinct ? l % kKinds : 0], dim3(1), dim3(32), 0, s, buf.get());
        if (evicting)
          cuda::launch_programmatic(evict_kernel, dim3(unsigned(sms)), dim3(1024), 0, s,
                                    reinterpret_cast<const uint4*>(evict.get()), kEvictBytes / 16, sink.get());
      }
    };
    return time_graph_us(chain, 1, 20) / kLinks;
  };
  const double evict_alone = [&] {
    const auto reads = [&](int, cudaStream_t s) {
      for (int l = 0; l < kLinks; ++l)
        cuda::launch_programmatic(evict_kernel, dim3(unsigned(sms)), dim3(1024), 0, s,
                                  reinterpret_cast<const uint4*>(evict.get()), kEvictBytes / 16, sink.get());
    };
    return time_graph_us(reads, 1, 20) / kLinks;
  }();

  Table t({"body (FMAs)", "code a kernel (about)", "between links", "same kernel µs/link", "16 kernels µs/link",
           "fetch µs/link (16 − same)"});
  for (const auto& [body, fns] : bodies)
    for (bool evicting : {false, true}) {
      double same = per_link(fns, false, evicting), distinct = per_link(fns, true, evicting);
      if (evicting) same -= evict_alone, distinct -= evict_alone;
      t.add({std::to_string(body), fmt::format("{} KB", body * 16 / 1024),
             evicting ? fmt::format("a {} MB read (less its own {:.2f} µs)", kEvictBytes >> 20, evict_alone) : "nothing",
             fmt::format("{:.2f}", same), fmt::format("{:.2f}", distinct), fmt::format("{:.2f}", distinct - same)});
    }
  t.print("One link of a dependent launch chain");
}

}  // namespace dsv4::bench
