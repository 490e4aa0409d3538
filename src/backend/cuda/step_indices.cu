// One thread per output value (blockIdx.y: which description of the launch); every kind is a pure function of the spans, a row's position and
// the block tables (cpu/step_indices_reference.cpp is the same arithmetic, sequentially).
#include "backend/cuda/step_indices.h"

#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/ptx_primitives.cuh"
#include "core/error.h"

namespace dsv4::cuda {

namespace {
constexpr int kThreads = 256;
constexpr int kPage = 64;

__device__ __forceinline__ int32_t table_entry(const int32_t* table, int64_t width, int64_t span, int64_t j) {
  return int32_t(int64_t(table[span * width + j / kPage]) * kPage + j % kPage);
}

// Value i of one description.
__device__ __forceinline__ void step_index(const cpu::StepIndexArrays& a, int64_t i, int32_t* out) {
  const int W = a.window_size;
  auto scratch_entry = [&](int64_t r) { return int32_t(int64_t(a.scratch[r / kPage]) * kPage + r % kPage); };
  switch (a.kind) {
    case StepIndexKind::NewEntries: out[i] = scratch_entry(i); return;
    case StepIndexKind::KeyCounts: out[i] = int32_t((int64_t(a.positions[i]) + 1) / a.ratio); return;
    case StepIndexKind::RingSlots: {
      const int64_t s = a.row_span[i], row0 = a.span_table[s * 3], n = a.span_table[s * 3 + 1],
                    pos0 = a.span_table[s * 3 + 2], k = i - row0;
      out[i] = k >= n - W ? table_entry(a.window, a.window_width, s, (pos0 + k) % W) : -1;
      return;
    }
    case StepIndexKind::AttentionLists: {
      const int64_t L = W + a.count, r = i / L, c = i % L;
      const int64_t s = a.row_span[r], row0 = a.span_table[s * 3], pos0 = a.span_table[s * 3 + 2], pos = a.positions[r];
      int32_t v = -1;
      if (c < W) {
        const int64_t p = (pos - W + 1 > 0 ? pos - W + 1 : 0) + c;  // the window, oldest first
        if (p <= pos) v = p >= pos0 ? scratch_entry(row0 + (p - pos0)) : table_entry(a.window, a.window_width, s, p % W);
      } else if (a.ratio == 4) {
        const int32_t j = a.topk[r * a.count + (c - W)];
        if (j >= 0) v = table_entry(a.compressed, a.compressed_width, s, j);
      } else if (a.ratio == 128) {
        if (c - W < (pos + 1) / 128) v = table_entry(a.compressed, a.compressed_width, s, c - W);
      }
      out[i] = v;
      return;
    }
    case StepIndexKind::CompressedEntries:
    case StepIndexKind::CompressedPositions: {
      // Entry i of the step: walk the spans (a step has few) to the one that completes it.
      int64_t e = i;
      for (int64_t s = 0; s < a.spans; ++s) {
        const int64_t n = a.span_table[s * 3 + 1], pos0 = a.span_table[s * 3 + 2];
        const int64_t j0 = pos0 / a.ratio, here = (pos0 + n) / a.ratio - j0;
        if (e < here) {
          const int64_t j = j0 + e;
          out[i] = a.kind == StepIndexKind::CompressedPositions ? int32_t(a.ratio * j)
                                                                : table_entry(a.compressed, a.compressed_width, s, j);
          return;
        }
        e -= here;
      }
      out[i] = a.kind == StepIndexKind::CompressedPositions ? 0 : -1;  // a fixed-shape step's padding
      return;
    }
  }
}

// The descriptions of one launch, read in place from the parameter space (blockIdx.y picks one).
struct StepIndexSets {
  cpu::StepIndexArrays a[kMaxStepIndexSets];
  int32_t* out[kMaxStepIndexSets];
  int64_t size[kMaxStepIndexSets];
};

__global__ void __launch_bounds__(kThreads) step_indices_kernel(const __grid_constant__ StepIndexSets sets) {
  pdl_wait();  // the tables are uploaded before the step, but the top-k and the outputs are earlier kernels'
  pdl_launch_dependents();
  const int set = blockIdx.y;
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i < sets.size[set]) step_index(sets.a[set], i, sets.out[set]);
}
}  // namespace

void step_indices(const cpu::StepIndexArrays* a, int32_t* const* out, int count, cudaStream_t stream) {
  if (count < 1 || count > kMaxStepIndexSets) fail("step_indices: {} descriptions in one launch (1…{})", count, kMaxStepIndexSets);
  StepIndexSets sets{};
  int64_t most = 0;
  for (int k = 0; k < count; ++k) {
    sets.a[k] = a[k], sets.out[k] = out[k], sets.size[k] = cpu::step_indices_size(a[k]);
    most = std::max(most, sets.size[k]);
  }
  if (most <= 0) return;
  if ((most + kThreads - 1) / kThreads > INT_MAX) fail("step_indices: {} values in one description", most);
  launch_programmatic(step_indices_kernel, dim3(unsigned((most + kThreads - 1) / kThreads), unsigned(count)), dim3(kThreads), 0,
                      stream, sets);
  DSV4_CUDA_CHECK_LAUNCH();
}

void step_indices(const cpu::StepIndexArrays& a, int32_t* out, cudaStream_t stream) { step_indices(&a, &out, 1, stream); }

}  // namespace dsv4::cuda
