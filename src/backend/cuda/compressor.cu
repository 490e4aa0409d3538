// The compressor state machine (SPEC §3.4) with one thread per output channel c: the channel's state
// columns (c, and d + c for the overlapping ratio-4 compressor) are touched by no other output, so
// each thread walks the chunk's tokens in order exactly as the CPU loop does, with the CPU's f32
// operations in the CPU's order (explicitly rounded: no FMA contraction). The one difference is exp:
// here the double exp rounded to f32 (correctly rounded but for rare ties), there glibc's expf
// (within 0.502 ulp): the pooled rows agree bit for bit except where those two exps differ by an ulp.
// Decode (n = 1) is one token per thread. A long prefill chunk would be a serial walk over its
// tokens, so it runs in two kernels instead: every entry the chunk completes pooled by its own
// thread (channel × entry) from the chunk's rows and the incoming state — the same values in the
// same operation order as the walk, so the same bits — then the walk itself for the state only,
// over the chunk's last two windows (earlier tokens leave nothing in the state). Every span of a
// step goes in the same launch (grid.y: spans, or entries), each reading its rows, positions and
// state slot from the step's span table on the device, so a recorded step serves any sequences.
#include "backend/cuda/compressor.h"

#include <algorithm>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/ptx_primitives.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ float exp_f32(float x) { return float(exp(double(x))); }

struct Span {
  int64_t row0, n, pos0, slot;
};

__device__ __forceinline__ Span load_span(const int32_t* spans, const int32_t* slots, int64_t s) {
  return {spans[s * 3], spans[s * 3 + 1], spans[s * 3 + 2], slots[s]};
}

__device__ __forceinline__ int64_t entries_of(const int32_t* spans, int64_t s, int ratio) {
  const int64_t n = spans[s * 3 + 1], pos0 = spans[s * 3 + 2];
  return (pos0 + n) / ratio - pos0 / ratio;
}

// Block (channels, span s): span s's walk; with `pool`, its entries pooled into out from the row
// the spans before it end at. Block y = S (with `pool`) zeroes the rows past the step's entries.
__global__ void __launch_bounds__(kThreads)
    compressor_update_kernel(const float* __restrict__ a, const float* __restrict__ g, const int32_t* __restrict__ spans,
                             const int32_t* __restrict__ slots, int64_t S, const float* __restrict__ ape, int ratio,
                             int d, float* __restrict__ state_kv, float* __restrict__ state_sc, float* __restrict__ out,
                             int64_t capacity, bool pool) {
  pdl_wait();
  pdl_launch_dependents();
  const int c = blockIdx.x * kThreads + threadIdx.x;
  if (c >= d) return;
  const int64_t s = blockIdx.y;
  if (s == S) {
    int64_t e = 0;
    for (int64_t k = 0; k < S; ++k) e += entries_of(spans, k, ratio);
    for (; e < capacity; ++e) out[e * d + c] = 0.f;
    return;
  }
  const Span sp = load_span(spans, slots, s);
  if (sp.n <= 0) return;
  const int coff = ratio == 4 ? 2 : 1;
  const int64_t width = int64_t(coff) * d;
  const int pool_rows = coff * ratio;
  float* kv = state_kv + sp.slot * pool_rows * width;
  float* sc = state_sc + sp.slot * pool_rows * width;
  // State column of pooling row r: overlapping windows take rows 0..ratio−1 (the previous window)
  // from the first half and rows ratio..2·ratio−1 (the current one) from the second.
  auto column = [&](int r) -> int64_t { return coff == 2 && r >= ratio ? d + c : c; };
  int64_t emitted = 0;
  for (int64_t k = 0; k < s; ++k) emitted += entries_of(spans, k, ratio);
  // Without pooling (a long chunk's entries pooled by compressor_pool_kernel) only the last two
  // windows' tokens leave anything in the state.
  const int64_t last_window = (sp.pos0 + sp.n - 1) / ratio;
  const int64_t first = pool ? 0 : max(int64_t(0), (last_window - 1) * ratio - sp.pos0);
  for (int64_t i = first; i < sp.n; ++i) {
    const int phase = int((sp.pos0 + i) % ratio);
    const int64_t slot = (coff == 2 ? ratio : 0) + phase;
    const float* a_row = a + (sp.row0 + i) * width;
    const float* g_row = g + (sp.row0 + i) * width;
    for (int h = 0; h < coff; ++h) {
      const int64_t col = c + int64_t(h) * d;
      kv[slot * width + col] = a_row[col];
      sc[slot * width + col] = __fadd_rn(g_row[col], ape[phase * width + col]);
    }
    if (phase != ratio - 1) continue;
    if (pool) {
      float mx = -INFINITY;
      for (int r = 0; r < pool_rows; ++r) {
        const float v = sc[r * width + column(r)];
        mx = mx < v ? v : mx;  // std::max(mx, v)
      }
      float sum = 0.f;
      for (int r = 0; r < pool_rows; ++r) sum = __fadd_rn(sum, exp_f32(__fsub_rn(sc[r * width + column(r)], mx)));
      float acc = 0.f;
      for (int r = 0; r < pool_rows; ++r) {
        const float w = exp_f32(__fsub_rn(sc[r * width + column(r)], mx));
        acc = __fadd_rn(acc, __fmul_rn(kv[r * width + column(r)], __fdiv_rn(w, sum)));
      }
      out[emitted * d + c] = acc;
    }
    if (coff == 2)
      for (int r = 0; r < ratio; ++r)
        for (int h = 0; h < 2; ++h) {
          const int64_t col = c + int64_t(h) * d;
          kv[r * width + col] = kv[(ratio + r) * width + col];
          sc[r * width + col] = sc[(ratio + r) * width + col];
        }
    ++emitted;
  }
}

// Entry e of the step for channel c: its span (the spans before it complete fewer than e + 1),
// its window k = pos0 / ratio + (its index in the span), completed at position k·ratio + ratio − 1;
// its pooling rows read from the chunk where their positions are in it, else from the incoming
// state — the rows the walk would have left there. Entries past the step's: zero rows.
__global__ void __launch_bounds__(kThreads)
    compressor_pool_kernel(const float* __restrict__ a, const float* __restrict__ g, const int32_t* __restrict__ spans,
                           const int32_t* __restrict__ slots, int64_t S, const float* __restrict__ ape, int ratio,
                           int d, const float* __restrict__ state_kv, const float* __restrict__ state_sc,
                           float* __restrict__ out) {
  pdl_wait();
  pdl_launch_dependents();
  const int c = blockIdx.x * kThreads + threadIdx.x;
  if (c >= d) return;
  int64_t e = blockIdx.y, s = 0;
  for (; s < S; ++s) {
    const int64_t here = entries_of(spans, s, ratio);
    if (e < here) break;
    e -= here;
  }
  if (s == S) {
    out[int64_t(blockIdx.y) * d + c] = 0.f;
    return;
  }
  const Span sp = load_span(spans, slots, s);
  const int coff = ratio == 4 ? 2 : 1;
  const int64_t width = int64_t(coff) * d;
  const int pool_rows = coff * ratio;
  const float* kv = state_kv + sp.slot * pool_rows * width;
  const float* sc = state_sc + sp.slot * pool_rows * width;
  const int64_t w0 = sp.pos0 / ratio, k = w0 + e;
  // Pooling row r → (kv, score). Overlapping windows: rows 0..ratio−1 are window k − 1 (first half
  // of the columns), rows ratio.. window k (second half); else rows 0..ratio−1 are window k.
  auto value = [&](int r, float& v, float& sv) {
    const bool previous = coff == 2 && r < ratio;
    const int phase = previous ? r : r - (coff == 2 ? ratio : 0);
    const int64_t window = previous ? k - 1 : k, q = window * ratio + phase;
    const int64_t col = c + (coff == 2 && !previous ? d : 0);
    if (q >= sp.pos0) {
      const int64_t row = sp.row0 + (q - sp.pos0);
      v = a[row * width + col];
      sv = __fadd_rn(g[row * width + col], ape[phase * width + col]);
    } else {
      // Before the chunk: window w0's tokens sit in the current rows (ratio + phase when
      // overlapping), window w0 − 1's in rows 0..ratio−1 (copied when it completed).
      const int64_t slot = window == w0 ? (coff == 2 ? ratio : 0) + phase : phase;
      v = kv[slot * width + col];
      sv = sc[slot * width + col];
    }
  };
  float mx = -INFINITY;
  for (int r = 0; r < pool_rows; ++r) {
    float v, sv;
    value(r, v, sv);
    mx = mx < sv ? sv : mx;  // std::max(mx, v)
  }
  float sum = 0.f;
  for (int r = 0; r < pool_rows; ++r) {
    float v, sv;
    value(r, v, sv);
    sum = __fadd_rn(sum, exp_f32(__fsub_rn(sv, mx)));
  }
  float acc = 0.f;
  for (int r = 0; r < pool_rows; ++r) {
    float v, sv;
    value(r, v, sv);
    const float w = exp_f32(__fsub_rn(sv, mx));
    acc = __fadd_rn(acc, __fmul_rn(v, __fdiv_rn(w, sum)));
  }
  out[int64_t(blockIdx.y) * d + c] = acc;
}

__global__ void __launch_bounds__(256) compressor_state_init_kernel(float* __restrict__ kv, float* __restrict__ sc,
                                                                    int64_t count) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (i >= count) return;
  kv[i] = 0.f;
  sc[i] = -INFINITY;
}

}  // namespace

void compressor_update(const float* a, const float* g, const int32_t* spans, const int32_t* slots, int64_t S,
                       int64_t max_span_rows, const float* ape, int ratio, int d, float* state_kv, float* state_score,
                       float* out, int64_t capacity, cudaStream_t stream) {
  if (ratio <= 0 || d <= 0 || S < 0 || capacity < 0 || S >= 65535)
    fail("compressor_update: ratio {}, d {}, {} spans, {} entry rows", ratio, d, S, capacity);
  if (S == 0 && capacity == 0) return;
  const unsigned channel_blocks = unsigned((d + kThreads - 1) / kThreads);
  if (max_span_rows <= 4 * int64_t(ratio) || capacity > 65535) {  // decode and short chunks: the walk does both
    launch_programmatic(compressor_update_kernel, dim3(channel_blocks, unsigned(S + 1)), dim3(kThreads), 0, stream, a, g,
                        spans, slots, S, ape, ratio, d, state_kv, state_score, out, capacity, true);
    DSV4_CUDA_CHECK_LAUNCH();
    return;
  }
  if (capacity)
    launch_programmatic(compressor_pool_kernel, dim3(channel_blocks, unsigned(capacity)), dim3(kThreads), 0, stream, a, g,
                        spans, slots, S, ape, ratio, d, state_kv, state_score, out);
  DSV4_CUDA_CHECK_LAUNCH();
  if (S)
    launch_programmatic(compressor_update_kernel, dim3(channel_blocks, unsigned(S)), dim3(kThreads), 0, stream, a, g, spans,
                        slots, S, ape, ratio, d, state_kv, state_score, out, capacity, false);
  DSV4_CUDA_CHECK_LAUNCH();
}

void compressor_state_init(float* state_kv, float* state_score, int ratio, int d, cudaStream_t stream) {
  if (ratio <= 0 || d <= 0) fail("compressor_state_init: ratio {}, d {}", ratio, d);
  const int coff = ratio == 4 ? 2 : 1;
  const int64_t count = int64_t(coff) * ratio * coff * d;
  launch_programmatic(compressor_state_init_kernel, dim3(unsigned((count + 255) / 256)), dim3(256), 0, stream, state_kv,
                      state_score, count);
  DSV4_CUDA_CHECK_LAUNCH();
}

}  // namespace dsv4::cuda
