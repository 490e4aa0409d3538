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
// over the chunk's last two windows (earlier tokens leave nothing in the state).
#include "backend/cuda/compressor.h"

#include <algorithm>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/ptx_primitives.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ float exp_f32(float x) { return float(exp(double(x))); }

__global__ void __launch_bounds__(kThreads)
    compressor_update_kernel(const float* __restrict__ a, const float* __restrict__ g, int64_t row0, int64_t n,
                             int64_t pos0, const float* __restrict__ ape, int ratio, int d, float* __restrict__ kv,
                             float* __restrict__ sc, float* __restrict__ out, int64_t first, bool pool) {
  pdl_wait();
  pdl_launch_dependents();
  const int c = blockIdx.x * kThreads + threadIdx.x;
  if (c >= d) return;
  const int coff = ratio == 4 ? 2 : 1;
  const int64_t width = int64_t(coff) * d;
  const int pool_rows = coff * ratio;
  // State column of pooling row r: overlapping windows take rows 0..ratio−1 (the previous window)
  // from the first half and rows ratio..2·ratio−1 (the current one) from the second.
  auto column = [&](int r) -> int64_t { return coff == 2 && r >= ratio ? d + c : c; };
  int64_t emitted = 0;
  for (int64_t i = first; i < n; ++i) {
    const int phase = int((pos0 + i) % ratio);
    const int64_t slot = (coff == 2 ? ratio : 0) + phase;
    const float* a_row = a + (row0 + i) * width;
    const float* g_row = g + (row0 + i) * width;
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

// Entry e of the chunk (window k = pos0 / ratio + e, completed at position k·ratio + ratio − 1) for
// channel c: its pooling rows read from the chunk where their positions are in it, else from the
// incoming state — the rows the walk would have left there.
__global__ void __launch_bounds__(kThreads)
    compressor_pool_kernel(const float* __restrict__ a, const float* __restrict__ g, int64_t row0, int64_t pos0,
                           const float* __restrict__ ape, int ratio, int d, const float* __restrict__ kv,
                           const float* __restrict__ sc, float* __restrict__ out) {
  pdl_wait();
  pdl_launch_dependents();
  const int c = blockIdx.x * kThreads + threadIdx.x;
  if (c >= d) return;
  const int64_t e = blockIdx.y;
  const int coff = ratio == 4 ? 2 : 1;
  const int64_t width = int64_t(coff) * d;
  const int pool_rows = coff * ratio;
  const int64_t w0 = pos0 / ratio, k = w0 + e;
  // Pooling row r → (kv, score). Overlapping windows: rows 0..ratio−1 are window k − 1 (first half
  // of the columns), rows ratio.. window k (second half); else rows 0..ratio−1 are window k.
  auto value = [&](int r, float& v, float& s) {
    const bool previous = coff == 2 && r < ratio;
    const int phase = previous ? r : r - (coff == 2 ? ratio : 0);
    const int64_t window = previous ? k - 1 : k, q = window * ratio + phase;
    const int64_t col = c + (coff == 2 && !previous ? d : 0);
    if (q >= pos0) {
      const int64_t row = row0 + (q - pos0);
      v = a[row * width + col];
      s = __fadd_rn(g[row * width + col], ape[phase * width + col]);
    } else {
      // Before the chunk: window w0's tokens sit in the current rows (ratio + phase when
      // overlapping), window w0 − 1's in rows 0..ratio−1 (copied when it completed).
      const int64_t slot = window == w0 ? (coff == 2 ? ratio : 0) + phase : phase;
      v = kv[slot * width + col];
      s = sc[slot * width + col];
    }
  };
  float mx = -INFINITY;
  for (int r = 0; r < pool_rows; ++r) {
    float v, s;
    value(r, v, s);
    mx = mx < s ? s : mx;  // std::max(mx, v)
  }
  float sum = 0.f;
  for (int r = 0; r < pool_rows; ++r) {
    float v, s;
    value(r, v, s);
    sum = __fadd_rn(sum, exp_f32(__fsub_rn(s, mx)));
  }
  float acc = 0.f;
  for (int r = 0; r < pool_rows; ++r) {
    float v, s;
    value(r, v, s);
    const float w = exp_f32(__fsub_rn(s, mx));
    acc = __fadd_rn(acc, __fmul_rn(v, __fdiv_rn(w, sum)));
  }
  out[e * d + c] = acc;
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

void compressor_update(const float* a, const float* g, int64_t row0, int64_t n, int64_t pos0, const float* ape, int ratio,
                       int d, float* state_kv, float* state_score, float* out, cudaStream_t stream) {
  if (ratio <= 0 || d <= 0 || n < 0 || row0 < 0 || pos0 < 0)
    fail("compressor_update: ratio {}, d {}, rows {} + {}, pos0 {}", ratio, d, row0, n, pos0);
  if (n == 0) return;
  const unsigned channel_blocks = unsigned((d + kThreads - 1) / kThreads);
  const int64_t entries = (pos0 + n) / ratio - pos0 / ratio;
  if (n <= 4 * int64_t(ratio) || entries > 65535) {  // decode and short chunks: the walk does both
    launch_programmatic(compressor_update_kernel, dim3(channel_blocks), dim3(kThreads), 0, stream, a, g, row0, n, pos0,
                        ape, ratio, d, state_kv, state_score, out, int64_t(0), true);
    DSV4_CUDA_CHECK_LAUNCH();
    return;
  }
  if (entries)
    launch_programmatic(compressor_pool_kernel, dim3(channel_blocks, unsigned(entries)), dim3(kThreads), 0, stream, a, g,
                        row0, pos0, ape, ratio, d, state_kv, state_score, out);
  DSV4_CUDA_CHECK_LAUNCH();
  // The state: only the last two windows' tokens leave anything in it (the last one's rows, the
  // one before it copied into rows 0..ratio−1 when overlapping, or its rows not yet overwritten).
  const int64_t last_window = (pos0 + n - 1) / ratio;
  const int64_t first = std::max<int64_t>(0, (last_window - 1) * ratio - pos0);
  launch_programmatic(compressor_update_kernel, dim3(channel_blocks), dim3(kThreads), 0, stream, a, g, row0, n, pos0,
                      ape, ratio, d, state_kv, state_score, out, first, false);
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
