// One thread per output value; every kind is a pure function of the spans, a row's position and
// the block tables (cpu/step_indices_reference.cpp is the same arithmetic, sequentially).
#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/step_indices.h"

namespace dsv4::cuda {

namespace {
constexpr int kThreads = 256;
constexpr int kPage = 64;

__device__ __forceinline__ int32_t table_entry(const int32_t* table, int64_t width, int64_t span, int64_t j) {
  return int32_t(int64_t(table[span * width + j / kPage]) * kPage + j % kPage);
}

__global__ void __launch_bounds__(kThreads) step_indices_kernel(const cpu::StepIndexArrays a, int64_t size, int32_t* out) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= size) return;
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
}  // namespace

void step_indices(const cpu::StepIndexArrays& a, int64_t out_size, int32_t* out, cudaStream_t stream) {
  if (out_size <= 0) return;
  step_indices_kernel<<<unsigned((out_size + kThreads - 1) / kThreads), kThreads, 0, stream>>>(a, out_size, out);
  DSV4_CUDA_CHECK_LAUNCH();
}

}  // namespace dsv4::cuda
