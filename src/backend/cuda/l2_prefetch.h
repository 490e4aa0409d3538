// Backend::prefetch on the GPU: byte ranges sent toward L2 by the bulk-copy engines
// (cp.async.bulk.prefetch.L2), so that a decode step's next weights stream from HBM while the
// latency-bound kernels before them leave it idle. A hint only: nothing is written, and no result
// depends on whether the bytes arrive. sm_90 and later.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dsv4::cuda {

// Steps of up to this many rows send their routed experts' weights ahead (a decode step's MoE is
// latency-bound there and leaves HBM time over); larger steps stream them at full rate anyway.
inline constexpr int64_t kPrefetchMaxRows = 64;

struct PrefetchRange {
  const void* p;
  size_t bytes;
};

// At most kMaxPrefetchRanges ranges a launch; each is trimmed inward to 16-byte bounds (the bulk
// engine's unit), so no byte outside a range is touched.
constexpr int kMaxPrefetchRanges = 16;
void l2_prefetch(const PrefetchRange* ranges, int count, cudaStream_t stream);

// Per-expert ranges chosen on the device: for each of the n_ids ids in [0, experts) (others are
// skipped), the first bytes[t] of table t's slice base[t] + id · stride[t]. The routed experts of a
// step, from the router's ids, before the expert GEMMs read them.
struct ExpertPrefetch {
  static constexpr int kTables = 4;
  const uint8_t* base[kTables];
  size_t stride[kTables], bytes[kTables];
  int tables;
};
void l2_prefetch_experts(const int32_t* ids, int n_ids, int experts, const ExpertPrefetch& e, cudaStream_t stream);

}  // namespace dsv4::cuda
