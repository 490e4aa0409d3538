// Tensor-core GEMMs for the dense linears at large row counts (prefill), through cuBLASLt: the
// FP8_BLOCK linears with DeepSeek's block scales (sm_90 only: cuBLASLt's 128-element and 128×128
// block scaling is a Hopper feature) and the bf16-weight linears with bf16 input (bf16 or f32 out,
// grouped or not). The decode kernels of linear.h stay the path for small row counts, for f32 inputs
// and for whatever cuBLASLt cannot run; CudaBackend chooses per call by rows (linear_path_uses_gemm).
//
// Layouts. Row-major Y[M, N] = X[M, K]·W[N, K]ᵀ is, in cuBLAS's column-major terms, Yᵀ (N × M,
// ld N) = op(A)·op(B) with A = W seen as K × N (ld K) and op T, B = X seen as K × M (ld K) and op N:
// the "TN" form FP8 needs on Hopper. cuBLAS's m is our N (weight outputs), its n our M (rows).
//
// FP8 scales (cuBLAS docs, "128-element 1D and 128×128 2D block scaling"; A 2D with B 1D is a
// supported pair, m and n must be multiples of 4, scale tensors 16-byte aligned):
//  - A (the weight), BLK128x128_32F: f32, K-major, L4 = round_up(K/128, 4) floats per block of 128
//    outputs — element (n/128, b) at (n/128)·L4 + b. The checkpoint's ue8m0 bytes [⌈N/128⌉, K/128]
//    are converted once per weight (2^(e−127), exact; zero padding to L4) and cached here.
//  - B (the activations), VEC128_32F: f32, "N-major" in cuBLAS's terms = row-major along our rows:
//    element (r, b) at b·M4 + r, M4 = round_up(M, 4). act_quant_fp8_mn_major writes this layout
//    directly, and zero codes and scales for the padding rows M … M4−1, so the GEMM runs on M4 rows
//    and y needs room for M4 rows (the extra rows are scratch, their values 0).
//
// Numerics: products of e4m3 pairs are exact; cuBLASLt applies sx·sw (powers of two) per 128-block
// partial and accumulates the partials in f32 — the reference's structure — but the tensor cores'
// accumulation inside a 128-block is their own (on Hopper FP8 MMA it is narrower than f32; see
// tests/ops/linear_gpu_test.cu for what that means for the bound). bf16 GEMMs accumulate in f32
// (CUBLAS_COMPUTE_32F); split-K partials are reduced in f32, never in the bf16 output type.
//
// One handle and one 32 MiB workspace per instance, used in the order of the stream the calls
// enqueue on (the backend has one stream; two streams using one instance at once would race).
// Plans (descriptors + the heuristic's algorithm, or "none") are cached per shape, so the choice
// is made once; a shape cuBLASLt has no algorithm for reports false from *_available and the caller
// uses the kernel. Not thread-safe (the backend's ops run on one thread).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "backend/cuda/cuda_utils.h"

namespace dsv4::cuda {

// DSV4_LINEAR_PATH: auto (default) chooses by rows; kernel / cublaslt force one path (tests and
// benchmarks). A forced cuBLASLt still falls back to the kernel where cuBLASLt cannot run the shape.
enum class LinearPathMode { Auto, Kernel, CublasLt };
LinearPathMode linear_path_mode_from_env();
const char* linear_path_mode_name(LinearPathMode mode);

// The rows from which the auto mode runs a linear on cuBLASLt instead of the decode kernels, from
// `dsv4 bench-ops linear` on the H200 (docs/perf/2026-12-01-decode-profile.md): bf16 weights from
// 16 rows (below, cuBLASLt's ~11–16 µs floor loses to the kernels on the narrow linears), the head
// (≥ 256 MB of weight) at every row count (1.15× at one row, 34× at 64); FP8 weights, which go
// through a bf16 GEMM of their dequantised values (fp8_via_bf16), from 64 rows when they hold at
// least 8M values (wq_b, wo_b, the indexer's wq_b, the shared expert: the tensor-core kernel
// linear_fp8_mma.cu is 2.7–3.3× faster at 1–8 rows, 1.6–2.7× at 16, 0.9–1.2× slower at 64), from
// 128 below (wq_a, wkv: the kernel 0.8–0.9× cuBLASLt's time at 64 rows).
constexpr int64_t kBf16GemmMinRows = 16;
constexpr double kBf16GemmAnyRowsBytes = 256e6;
constexpr int64_t kFp8GemmMinRows = 128, kFp8GemmMinRowsLarge = 64;
constexpr int64_t kFp8GemmLargeValues = int64_t(8) << 20;
// wo_a stored as FP8 (grouped_out_proj): the tensor-core kernel linear_fp8w_mma below
// kFp8wGemmMinRows, and from there (prefill chunks) a bf16 copy of the weight per call through
// cuBLASLt (`dsv4 bench-ops linear`, table wo_a).
constexpr int64_t kFp8wGemmMinRows = 512;
// The large FP8 block linears (kFp8GemmLargeValues and up: wq_b, wo_b, the shared expert's): in
// [kFp8TiledMinRows, kFp8TiledMaxRows) linear_fp8w_mma on the quantised activations' bf16 values,
// ahead of linear_fp8_mma.cu's kernel and of cuBLASLt (whose FP8 path is a per-call bf16 copy of the
// weight: at 32–64 rows the tiled kernel took 0.64–0.98× the faster of them). The small ones (wq_a,
// wkv: a few column tiles) stay on the kernel: tiled, they took 35 µs at 64 rows against its 23
// (docs/perf/2026-12-07-wo-a-fp8-tiled.md). Nor do those under kFp8TiledMinCols columns (the shared
// expert's w1 and w3, 2048 each): tiled, they are two launches of 16 column tiles; below
// kFp8GemmMinRowsLarge the kernel runs both in one launch, from there cuBLASLt
// (docs/perf/2026-12-07-tile-finisher.md).
constexpr int64_t kFp8TiledMinRows = 32, kFp8TiledMaxRows = 128, kFp8TiledMinCols = 4096;
inline int64_t fp8_gemm_min_rows(int N, int K) {
  return int64_t(N) * K >= kFp8GemmLargeValues ? kFp8GemmMinRowsLarge : kFp8GemmMinRows;
}

inline bool linear_path_uses_gemm(LinearPathMode mode, int64_t rows, int64_t min_rows) {
  return mode == LinearPathMode::CublasLt || (mode == LinearPathMode::Auto && rows >= min_rows);
}

class LinearGemm {
 public:
  LinearGemm();
  ~LinearGemm();
  LinearGemm(const LinearGemm&) = delete;
  LinearGemm& operator=(const LinearGemm&) = delete;

  // Whether this GPU and library can run block-scaled FP8 at all (sm_90 and the handle was created),
  // and why not ("" when they can).
  bool fp8_supported() const { return fp8_why_not_.empty(); }
  const std::string& fp8_why_not() const { return fp8_why_not_; }

  // Rows the FP8 GEMM runs on for `rows` input rows (the buffers' row count: act_q, y).
  static int64_t fp8_padded_rows(int64_t rows) { return (rows + 3) / 4 * 4; }

  // CpuBackend::linear for FP8_BLOCK weights as a bf16 GEMM: the activations quantised as the
  // kernel does (act_quant_fp8: act_q e4m3 [rows, K], act_scale f32 [rows, K/128]), both operands
  // turned into their exact bf16 values (x_bf16 [rows, K], w_bf16 [N, K] scratch; linear.h
  // fp8_*_to_bf16), then bf16(x_bf16 · w_bf16ᵀ) with f32 accumulation: the reference's products,
  // summed in f32 — within the f32 bound the kernel meets. y bf16 [rows, N]. This, not fp8_block,
  // is what the backend runs: fp8_block's block-scaled FP8 accumulates each 128-block below f32 on
  // Hopper and leaves that bound (1–2% of outputs, up to ~2800× it; golden layer_out.0 at 5.3e-2
  // against the 3e-2 limit), so it is kept for the benchmark's comparison only.
  // y_f32: y is the f32 sums before the rounding instead (Backend::linear_partial).
  bool fp8_via_bf16_available(int64_t rows, int K, int N, bool y_f32 = false) {
    return bf16_available(rows, K, K, 1, N, y_f32);
  }
  void fp8_via_bf16(const uint16_t* x, int64_t rows, int K, const uint8_t* w, const uint8_t* w_scale, int N,
                    uint8_t* act_q, float* act_scale, uint16_t* x_bf16, uint16_t* w_bf16, void* y,
                    cudaStream_t stream, bool y_f32 = false);
  // fp8_via_bf16's second half, for a weight whose input another call already quantised and turned
  // into x_bf16 (several linears of one input).
  void fp8_weight_via_bf16(const uint16_t* x_bf16, int64_t rows, int K, const uint8_t* w, const uint8_t* w_scale, int N,
                           uint16_t* w_bf16, void* y, cudaStream_t stream, bool y_f32 = false);

  // Whether fp8_block can run this shape (host only; the heuristic query is made once per shape).
  bool fp8_block_available(int64_t rows, int K, int N);
  // CpuBackend::linear for FP8_BLOCK weights (linear.h's math) on tensor cores. x bf16 [rows, K];
  // w e4m3 [N, K], w_scale ue8m0 [⌈N/128⌉, K/128] (the same pointers every call for one weight: the
  // f32 form is cached by w_scale). Scratch act_q e4m3 [M4, K], act_scale f32 [K/128, M4]; y bf16
  // with room for M4 = fp8_padded_rows(rows) rows (rows … M4−1 are overwritten). All 16-byte
  // aligned. Only for shapes fp8_block_available accepted. The first call for a weight converts its
  // scales (a device allocation): it must not be inside a CUDA-graph recording.
  void fp8_block(const uint16_t* x, int64_t rows, int K, const uint8_t* w, const uint8_t* w_scale, int N,
                 uint8_t* act_q, float* act_scale, uint16_t* y, cudaStream_t stream);

  // linear_bf16w (linear.h) with bf16 x on tensor cores: y[r, j] = Σ_k x[r·x_row_stride + g(j)·K + k]
  // · w[j·K + k], g(j) = j / (N / groups); y bf16 or f32 [rows, N]. Alignment: K, x_row_stride and
  // N / groups multiples of 8 are checked here; the pointers must be 16-byte aligned (bf16_aligned).
  bool bf16_available(int64_t rows, int K, int64_t x_row_stride, int groups, int N, bool y_f32);
  static bool bf16_aligned(const void* x, const void* w, const void* y);
  void bf16(const uint16_t* x, int64_t rows, int K, int64_t x_row_stride, int groups, const uint16_t* w, int N,
            void* y, bool y_f32, cudaStream_t stream);

  struct Plan;  // descriptors and the algorithm of one shape (linear_gemm.cu)

 private:
  const float* fp8_weight_scales(const uint8_t* w_scale, int K, int N, cudaStream_t stream);
  Plan* fp8_plan(int64_t rows, int K, int N);
  Plan* bf16_plan(int64_t rows, int K, int64_t x_row_stride, int groups, int N, bool y_f32);

  void* handle_ = nullptr;  // cublasLtHandle_t (kept opaque so this header needs no cuBLAS)
  DeviceBuffer<uint8_t> workspace_;
  std::string fp8_why_not_;
  // (kind, rows, K, row stride, groups, N) → plan; a null plan = cuBLASLt has no algorithm.
  std::map<std::tuple<int, int64_t, int, int64_t, int, int>, std::unique_ptr<Plan>> plans_;
  std::map<const uint8_t*, DeviceBuffer<float>> weight_scales_;  // FP8 A scales by w_scale
};

}  // namespace dsv4::cuda
