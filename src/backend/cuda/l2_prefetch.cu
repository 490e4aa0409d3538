// L2 prefetch of byte ranges (backend/cuda/l2_prefetch.h). One thread a piece of kPieceBytes: the
// pieces of a launch spread over many SMs, because each SM's bulk-copy engine works through its
// requests in order, and one engine alone would take longer to issue 30 MB than HBM takes to
// deliver it.
#include "backend/cuda/l2_prefetch.h"

#include <algorithm>

#include "backend/cuda/cuda_utils.h"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

constexpr uint32_t kPieceBytes = 16 << 10;
constexpr int kThreads = 32;  // a warp a block: as many SMs as pieces allow

__device__ __forceinline__ void bulk_prefetch_l2(uintptr_t p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
#else
  (void)p, (void)bytes;
#endif
}

// [begin, end) 16-byte aligned; first_piece[i] the launch's first piece in range i, first_piece[n]
// the total.
struct Pieces {
  uintptr_t begin[kMaxPrefetchRanges], end[kMaxPrefetchRanges];
  uint32_t first_piece[kMaxPrefetchRanges + 1];
  int n;
};

__global__ void __launch_bounds__(kThreads) l2_prefetch_kernel(const __grid_constant__ Pieces r) {
  const uint32_t piece = blockIdx.x * kThreads + threadIdx.x;
  if (piece >= r.first_piece[r.n]) return;
  int i = 0;
  while (piece >= r.first_piece[i + 1]) ++i;
  const uintptr_t p = r.begin[i] + uintptr_t(piece - r.first_piece[i]) * kPieceBytes;
  bulk_prefetch_l2(p, uint32_t(std::min<uintptr_t>(kPieceBytes, r.end[i] - p)));
}

// Thread (id j, piece q of the expert's pieces over the tables).
__global__ void __launch_bounds__(kThreads)
    l2_prefetch_experts_kernel(const int32_t* __restrict__ ids, int n_ids, int experts, const __grid_constant__ ExpertPrefetch e,
                               const __grid_constant__ Pieces per_expert) {
  const uint32_t total = per_expert.first_piece[per_expert.n];
  const uint64_t g = uint64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (g >= uint64_t(total) * n_ids) return;
  const int j = int(g / total);
  const uint32_t piece = uint32_t(g % total);
  const int id = ids[j];
  if (id < 0 || id >= experts) return;
  int t = 0;
  while (piece >= per_expert.first_piece[t + 1]) ++t;
  // per_expert holds offsets within the expert's slice of each table.
  const uintptr_t slice = reinterpret_cast<uintptr_t>(e.base[t]) + uintptr_t(id) * e.stride[t];
  const uintptr_t p = slice + per_expert.begin[t] + uintptr_t(piece - per_expert.first_piece[t]) * kPieceBytes;
  bulk_prefetch_l2(p, uint32_t(std::min<uintptr_t>(kPieceBytes, slice + per_expert.end[t] - p)));
}

uintptr_t align_up16(uintptr_t v) { return (v + 15) & ~uintptr_t(15); }
uintptr_t align_down16(uintptr_t v) { return v & ~uintptr_t(15); }

// Appends [begin, end), trimmed to 16-byte bounds (no pieces when nothing is left of it).
void add_range(Pieces& r, uintptr_t begin, uintptr_t end) {
  begin = align_up16(begin), end = std::max(begin, align_down16(end));
  const uint64_t pieces = (end - begin + kPieceBytes - 1) / kPieceBytes;
  if (uint64_t(r.first_piece[r.n]) + pieces > 0xffffffffu) fail("l2_prefetch: {} pieces exceed the launch", pieces);
  r.begin[r.n] = begin, r.end[r.n] = end;
  r.first_piece[r.n + 1] = r.first_piece[r.n] + uint32_t(pieces);
  ++r.n;
}

}  // namespace

void l2_prefetch(const PrefetchRange* ranges, int count, cudaStream_t stream) {
  if (count > kMaxPrefetchRanges) fail("l2_prefetch: {} ranges (at most {})", count, kMaxPrefetchRanges);
  Pieces r{};
  for (int i = 0; i < count; ++i) {
    const auto p = reinterpret_cast<uintptr_t>(ranges[i].p);
    if (p && ranges[i].bytes) add_range(r, p, p + ranges[i].bytes);
  }
  const uint32_t total = r.first_piece[r.n];
  if (!total) return;
  l2_prefetch_kernel<<<(total + kThreads - 1) / kThreads, kThreads, 0, stream>>>(r);
  DSV4_CUDA_CHECK(cudaGetLastError());
}

void l2_prefetch_experts(const int32_t* ids, int n_ids, int experts, const ExpertPrefetch& e, cudaStream_t stream) {
  if (e.tables < 0 || e.tables > ExpertPrefetch::kTables) fail("l2_prefetch_experts: {} tables", e.tables);
  Pieces per_expert{};
  for (int t = 0; t < e.tables; ++t) {
    if (e.bytes[t] > e.stride[t] || reinterpret_cast<uintptr_t>(e.base[t]) % 16 || e.stride[t] % 16)
      fail("l2_prefetch_experts: table {} takes {} of {} bytes an expert (16-byte aligned slices)", t, e.bytes[t],
           e.stride[t]);
    // Offsets within a slice (the slices are 16-byte aligned); range t is table t's.
    add_range(per_expert, 0, e.bytes[t]);
  }
  const uint64_t threads = uint64_t(per_expert.first_piece[per_expert.n]) * std::max(n_ids, 0);
  if (!threads) return;
  if (threads > (uint64_t(1) << 31)) fail("l2_prefetch_experts: {} pieces exceed the launch", threads);
  l2_prefetch_experts_kernel<<<unsigned((threads + kThreads - 1) / kThreads), kThreads, 0, stream>>>(ids, n_ids, experts,
                                                                                                    e, per_expert);
  DSV4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dsv4::cuda
