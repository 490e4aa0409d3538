// `dsv4 bench-ops linear`: the dense linears of DeepSeek-V4-Flash on both of their paths in one run —
// the kernels (linear.h: FP8 on tensor cores, bf16 on CUDA cores) and cuBLASLt (linear_gemm.h) — from decode (M = 1) to prefill
// (M = 8192 rows): the FP8 block projections (hidden 4096, q_lora 1024, 64 heads × 512, 8 output
// groups × o_lora 1024, indexer 64 heads × 128, shared expert 2048) and the bf16 head (logits, f32
// out). The FP8 times include the activation quantisation (part of the linear on both paths).
//
// Timing: median of CUDA-graph replays (bench_utils.h). L2 is not flushed; each replay walks
// rotating copies of the weights and activations (≥ 200 MB together, or two sets where one is
// larger), so weights stream from HBM as in a model step, on both paths alike.
// DSV4_LINEAR_BENCH_SHAPES=wq_b,head and DSV4_LINEAR_BENCH_ROWS=1,128 narrow the table.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/act_quant_fp8.h"
#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/linear_gemm.h"
#include "bench/bench_random.cuh"
#include "bench/bench_utils.h"
#include "bench/op_benchmarks.h"

namespace dsv4::bench {
namespace {

using cuda::DeviceBuffer;

struct Shape {
  const char* name;  // DSV4_LINEAR_BENCH_SHAPES key
  int N, K;
  bool fp8;  // FP8_BLOCK weights (else bf16 weights, f32 out: the head, the router's gate, the compressors)
};

constexpr Shape kShapes[] = {
    {"wq_a", 1024, 4096, true},      {"wq_b", 32768, 1024, true},       {"wkv", 512, 4096, true},
    {"wo_b", 4096, 8192, true},      {"indexer_wq_b", 8192, 1024, true}, {"shared_w1_w3", 2048, 4096, true},
    {"shared_w2", 4096, 2048, true}, {"head", 129280, 4096, false},
    {"gate", 256, 4096, false},  // also the indexer's compressor (wkv, wgate)
    {"compressor_hca", 512, 4096, false}, {"compressor_csa", 1024, 4096, false},
    {"weights_proj", 64, 4096, false},  // the indexer's head weights (bf16 out in the model)
};
constexpr int kRows[] = {1, 2, 4, 8, 16, 32, 64, 128, 512, 2048, 8192};
constexpr double kRotationBytes = 200e6;

// e4m3 codes without the NaNs (0x7f, 0xff), ue8m0 scales 2^-7 … 2^2, bf16 values in (−scale, scale).
__global__ void fill_e4m3(uint8_t* p, size_t n, uint32_t salt) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint8_t b = uint8_t(hash32(i, salt));
    p[i] = (b & 0x7f) == 0x7f ? uint8_t(b ^ 1) : b;
  }
}
__global__ void fill_ue8m0(uint8_t* p, size_t n, uint32_t salt) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint8_t(120 + hash32(i, salt) % 10);
}
__global__ void fill_bf16(uint16_t* p, size_t n, uint32_t salt, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = (float(hash32(i, salt) & 0xffffu) / 32768.f - 1.f) * scale;
    p[i] = uint16_t(__float_as_uint(v) >> 16);
  }
}

struct Weights {
  DeviceBuffer<uint8_t> w, scale;  // e4m3 + ue8m0, or bf16 (as bytes)
};

struct Activations {
  DeviceBuffer<uint16_t> x;
  DeviceBuffer<uint8_t> y, q;  // y bf16 (FP8) or f32 (head) with the GEMM's padding rows
  DeviceBuffer<float> s;
  DeviceBuffer<uint16_t> xb;  // the FP8 path's activations as bf16 values
};

// Microseconds of one eager pass over the rotations (after one warm-up call), to size the replays.
double eager_us(const std::function<void(int, cudaStream_t)>& variant, int rotations) {
  cuda::Stream stream;
  cuda::Event start, stop;
  variant(0, stream.get());
  stream.sync();
  start.record(stream.get());
  for (int k = 0; k < rotations; ++k) variant(k, stream.get());
  stop.record(stream.get());
  return double(stop.elapsed_ms_since(start)) * 1e3 / rotations;
}

// The median of CUDA-graph replays, ~0.2 s of replays at most (5 at least).
double time_us(const std::function<void(int, cudaStream_t)>& variant, int rotations) {
  const double est = eager_us(variant, rotations);
  const int replays = int(std::clamp(2e5 / std::max(est * rotations, 1.0), 5.0, 50.0));
  return time_graph_us(variant, rotations, replays);
}

struct Row {
  std::string shape;
  int M;
  double kernel_us;
  std::optional<double> gemm_us;  // none: cuBLASLt has no plan for the shape on this GPU
  std::optional<double> native_fp8_us;  // cuBLASLt's block-scaled FP8 (outside the f32 bound: not run by the engine)
  std::optional<double> tiled_us;  // FP8: linear_fp8w_mma on the quantised activations' bf16 values
  double bytes, flops;
};

void bench_shape(const Shape& sh, double copy_gbs, std::vector<Row>& rows) {
  if (!bench_selected("DSV4_LINEAR_BENCH_SHAPES", sh.name)) return;
  const int N = sh.N, K = sh.K, kb = K / 128, nb = (N + 127) / 128;
  const size_t w_bytes = sh.fp8 ? size_t(N) * K : size_t(N) * K * 2, s_bytes = sh.fp8 ? size_t(nb) * kb : 0;
  const int copies = int(std::clamp(std::ceil(kRotationBytes / double(w_bytes + s_bytes)), 1.0, 128.0));
  std::vector<Weights> weights(copies);
  for (int c = 0; c < copies; ++c) {
    weights[c].w = DeviceBuffer<uint8_t>(w_bytes);
    if (sh.fp8) {
      weights[c].scale = DeviceBuffer<uint8_t>(s_bytes);
      fill_e4m3<<<4096, 256>>>(weights[c].w.get(), w_bytes, 2 * c + 1);
      fill_ue8m0<<<256, 256>>>(weights[c].scale.get(), s_bytes, 2 * c + 2);
    } else {
      fill_bf16<<<4096, 256>>>(reinterpret_cast<uint16_t*>(weights[c].w.get()), w_bytes / 2, 2 * c + 1, 0.05f);
    }
  }
  DSV4_CUDA_CHECK_LAUNCH();
  // One instance per shape: its f32 scale cache is keyed by weight address, and the next shape's
  // weights may reuse this shape's addresses.
  cuda::LinearGemm gemm;
  for (int M : kRows) {
    if (!bench_selected("DSV4_LINEAR_BENCH_ROWS", std::to_string(M))) continue;
    const int64_t m4 = cuda::LinearGemm::fp8_padded_rows(M);
    const size_t y_bytes = size_t(m4) * N * (sh.fp8 ? 2 : 4);
    const double act_bytes = double(M) * K * 2 + double(y_bytes) + (sh.fp8 ? double(m4) * K : 0.0);
    const int rotations =
        std::min(copies > 1 ? copies : 2,
                 int(std::clamp(std::ceil(kRotationBytes / (double(w_bytes) + act_bytes)), 2.0, 128.0)));
    std::vector<Activations> acts(rotations);
    for (int r = 0; r < rotations; ++r) {
      acts[r].x = DeviceBuffer<uint16_t>(size_t(M) * K);
      acts[r].y = DeviceBuffer<uint8_t>(y_bytes);
      if (sh.fp8) {
        acts[r].q = DeviceBuffer<uint8_t>(size_t(m4) * K);
        acts[r].s = DeviceBuffer<float>(size_t(m4) * kb);
        acts[r].xb = DeviceBuffer<uint16_t>(size_t(M) * K);
      }
      fill_bf16<<<1024, 256>>>(acts[r].x.get(), acts[r].x.size(), 1000 + r, 1.f);
    }
    DSV4_CUDA_CHECK_LAUNCH();
    DSV4_CUDA_CHECK(cudaDeviceSynchronize());
    auto w_of = [&](int r) -> Weights& { return weights[r % copies]; };
    Row row{fmt::format("{} [{} × {}] {}", sh.name, N, K, sh.fp8 ? "FP8" : "bf16 → f32"), M, 0, std::nullopt, std::nullopt, 0, 0};
    // The dequantised weight of the FP8 path: one scratch, rewritten by every call (as in the backend).
    DeviceBuffer<uint16_t> w_bf16(sh.fp8 ? size_t(N) * K : 0);
    if (sh.fp8) {
      row.kernel_us = time_us(
          [&](int r, cudaStream_t s) {
            Activations& a = acts[r];
            cuda::linear_fp8_block(a.x.get(), M, K, w_of(r).w.get(), w_of(r).scale.get(), N, a.q.get(), a.s.get(),
                                   reinterpret_cast<uint16_t*>(a.y.get()), s);
          },
          rotations);
      if (gemm.fp8_via_bf16_available(M, K, N))
        row.gemm_us = time_us(
            [&](int r, cudaStream_t s) {
              Activations& a = acts[r];
              gemm.fp8_via_bf16(a.x.get(), M, K, w_of(r).w.get(), w_of(r).scale.get(), N, a.q.get(), a.s.get(),
                                a.xb.get(), w_bf16.get(), reinterpret_cast<uint16_t*>(a.y.get()), s);
            },
            rotations);
      if (gemm.fp8_block_available(M, K, N))
        row.native_fp8_us = time_us(
            [&](int r, cudaStream_t s) {
              Activations& a = acts[r];
              gemm.fp8_block(a.x.get(), M, K, w_of(r).w.get(), w_of(r).scale.get(), N, a.q.get(), a.s.get(),
                             reinterpret_cast<uint16_t*>(a.y.get()), s);
            },
            rotations);
    } else {
      auto w16 = [&](int r) { return reinterpret_cast<const uint16_t*>(w_of(r).w.get()); };
      row.kernel_us = time_us(
          [&](int r, cudaStream_t s) {
            cuda::linear_bf16w(acts[r].x.get(), false, M, K, K, 1, w16(r), N, acts[r].y.get(), true, s);
          },
          rotations);
      if (gemm.bf16_available(M, K, K, 1, N, true))
        row.gemm_us = time_us(
            [&](int r, cudaStream_t s) { gemm.bf16(acts[r].x.get(), M, K, K, 1, w16(r), N, acts[r].y.get(), true, s); },
            rotations);
    }
    if (sh.fp8 && cuda::linear_fp8w_mma_available(M, K, K, 1, N, acts[0].xb.get(), weights[0].w.get())) {
      std::vector<DeviceBuffer<float>> ws(rotations);
      for (auto& b : ws) b = DeviceBuffer<float>(std::max<size_t>(cuda::linear_fp8w_mma_workspace(M, K, N) / 4, 1));
      row.tiled_us = time_us(
          [&](int r, cudaStream_t s) {
            Activations& a = acts[r];
            cuda::act_quant_fp8(a.x.get(), M, K, a.q.get(), a.s.get(), s);
            cuda::fp8_rows_to_bf16(a.q.get(), a.s.get(), M, K, a.xb.get(), s);
            cuda::linear_fp8w_mma(a.xb.get(), M, K, K, 1, w_of(r).w.get(), w_of(r).scale.get(), N, a.y.get(),
                                  ws[r].get(), s);
          },
          rotations);
    }
    row.bytes = double(w_bytes + s_bytes) + double(M) * K * 2 + double(M) * N * (sh.fp8 ? 2 : 4);
    row.flops = 2.0 * M * double(N) * K;
    rows.push_back(row);
    const double best = row.gemm_us ? std::min(row.kernel_us, *row.gemm_us) : row.kernel_us;
    fmt::print(stderr, "  {} M {}: kernel {:.1f} µs, cuBLASLt {}, {:.0f} GB/s ({:.0f}% of copy)\n", row.shape, M,
               row.kernel_us, row.gemm_us ? fmt::format("{:.1f} µs", *row.gemm_us) : std::string("n/a"),
               row.bytes / (best * 1e-6) / 1e9, 100.0 * row.bytes / (best * 1e-6) / 1e9 / copy_gbs);
  }
}

// wo_a [8 groups × 1024, 4096] (each group reads its 4096 channels of the 32768-wide attention
// output) on every path grouped_out_proj has: the weight stored as bf16 (the kernel below 16 rows,
// cuBLASLt from 16: the engine's path before FP8 storage), and stored as the checkpoint's FP8 — the
// tensor-core kernel (linear_fp8w_mma) and a bf16 copy made per call for cuBLASLt (fp8_weight_to_bf16
// + the bf16 GEMM).
struct WoaRow {
  int M;
  double bf16_kernel = 0, bf16_gemm = 0, fp8_mma = 0, fp8_via_bf16 = 0;
};

void bench_wo_a(double copy_gbs) {
  if (!bench_selected("DSV4_LINEAR_BENCH_SHAPES", "wo_a")) return;
  constexpr int groups = 8, rank = 1024, K = 4096, N = groups * rank;
  const size_t n = size_t(N) * K, nb = size_t(N / 128) * (K / 128);
  const int copies8 = int(std::ceil(kRotationBytes / double(n))), copies16 = int(std::ceil(kRotationBytes / double(2 * n)));
  std::vector<Weights> w8(copies8), w16(copies16);
  for (int c = 0; c < copies8; ++c) {
    w8[c].w = DeviceBuffer<uint8_t>(n);
    w8[c].scale = DeviceBuffer<uint8_t>(nb);
    fill_e4m3<<<4096, 256>>>(w8[c].w.get(), n, 2 * c + 1);
    fill_ue8m0<<<256, 256>>>(w8[c].scale.get(), nb, 2 * c + 2);
  }
  for (int c = 0; c < copies16; ++c) {
    w16[c].w = DeviceBuffer<uint8_t>(2 * n);
    fill_bf16<<<4096, 256>>>(reinterpret_cast<uint16_t*>(w16[c].w.get()), n, 500 + c, 0.05f);
  }
  DSV4_CUDA_CHECK_LAUNCH();
  cuda::LinearGemm gemm;
  DeviceBuffer<uint16_t> w_bf16(n);  // the per-call copy
  std::vector<WoaRow> out;
  for (int M : kRows) {
    if (!bench_selected("DSV4_LINEAR_BENCH_ROWS", std::to_string(M))) continue;
    const int rotations = std::max(copies8, 2);
    std::vector<DeviceBuffer<uint16_t>> x(rotations), y(rotations);
    std::vector<DeviceBuffer<float>> ws(rotations);
    for (int r = 0; r < rotations; ++r) {
      x[r] = DeviceBuffer<uint16_t>(size_t(M) * groups * K);
      y[r] = DeviceBuffer<uint16_t>(size_t(M) * N);
      ws[r] = DeviceBuffer<float>(std::max<size_t>(cuda::linear_fp8w_mma_workspace(M, K, N) / 4, 1));
      fill_bf16<<<1024, 256>>>(x[r].get(), x[r].size(), 2000 + r, 1.f);
    }
    DSV4_CUDA_CHECK_LAUNCH();
    DSV4_CUDA_CHECK(cudaDeviceSynchronize());
    const auto b16 = [&](int r) { return reinterpret_cast<const uint16_t*>(w16[r % copies16].w.get()); };
    WoaRow row{M};
    if (M <= 64)
      row.bf16_kernel = time_us([&](int r, cudaStream_t s) {
        cuda::linear_bf16w(x[r].get(), false, M, K, int64_t(groups) * K, groups, b16(r), N, y[r].get(), false, s);
      }, rotations);
    if (gemm.bf16_available(M, K, int64_t(groups) * K, groups, N, false)) {
      row.bf16_gemm = time_us([&](int r, cudaStream_t s) {
        gemm.bf16(x[r].get(), M, K, int64_t(groups) * K, groups, b16(r), N, y[r].get(), false, s);
      }, rotations);
      row.fp8_via_bf16 = time_us([&](int r, cudaStream_t s) {
        cuda::fp8_weight_to_bf16(w8[r % copies8].w.get(), w8[r % copies8].scale.get(), N, K, w_bf16.get(), s);
        gemm.bf16(x[r].get(), M, K, int64_t(groups) * K, groups, w_bf16.get(), N, y[r].get(), false, s);
      }, rotations);
    }
    row.fp8_mma = time_us([&](int r, cudaStream_t s) {
      cuda::linear_fp8w_mma(x[r].get(), M, K, int64_t(groups) * K, groups, w8[r % copies8].w.get(),
                            w8[r % copies8].scale.get(), N, y[r].get(), ws[r].get(), s);
    }, rotations);
    fmt::print(stderr, "  wo_a M {}: bf16 kernel {:.1f}, bf16 cuBLASLt {:.1f}, fp8 mma {:.1f}, fp8 via bf16 {:.1f} µs\n", M,
               row.bf16_kernel, row.bf16_gemm, row.fp8_mma, row.fp8_via_bf16);
    out.push_back(row);
  }
  const auto cell = [](double us) { return us > 0 ? fmt::format("{:.1f}", us) : std::string("-"); };
  Table table({"M", "bf16 weight: kernel µs", "bf16 weight: cuBLASLt µs", "FP8: tensor-core kernel µs",
               "FP8: bf16 copy + cuBLASLt µs", "best FP8 % of copy (FP8 bytes)", "best FP8 / engine's bf16 path"});
  for (const WoaRow& r : out) {
    const double best8 = r.fp8_via_bf16 > 0 ? std::min(r.fp8_mma, r.fp8_via_bf16) : r.fp8_mma;
    const double bf16_path = r.M < cuda::kBf16GemmMinRows || r.bf16_gemm <= 0 ? r.bf16_kernel : r.bf16_gemm;
    const double bytes = double(n + nb) + double(r.M) * groups * K * 2 + double(r.M) * N * 2;
    table.add({fmt::format("{}", r.M), cell(r.bf16_kernel), cell(r.bf16_gemm), cell(r.fp8_mma), cell(r.fp8_via_bf16), fmt::format("{:.1f}%", 100.0 * bytes / (best8 * 1e-6) / 1e9 / copy_gbs),
               bf16_path > 0 ? fmt::format("{:.2f}×", best8 / bf16_path) : "-"});
  }
  table.print(fmt::format("wo_a [{} groups × {}, {}] by storage and path — copy bandwidth {:.0f} GB/s", groups, rank, K, copy_gbs));
}

}  // namespace

void bench_linear() {
  const double copy_gbs = measure_copy_bandwidth_gbs();
  cuda::LinearGemm probe;
  fmt::print("device-to-device copy bandwidth: {:.0f} GB/s (read + write)\n", copy_gbs);
  fmt::print("time = median of CUDA-graph replays over rotating weight/activation copies (L2 not flushed; the\n"
             "copies exceed it); FP8 times include the activation quantisation; bytes = weights + scales + x + y;\n"
             "GB/s, % copy and TFLOP/s (2·M·N·K) are those of the faster path. cuBLASLt on FP8 weights: the\n"
             "engine's path, a bf16 GEMM of the dequantised operands (dequantisation timed in). Native block-scaled\n"
             "FP8, timed for comparison only (it leaves the f32 bound, linear_gemm.h): {}\n",
             probe.fp8_supported() ? std::string("VEC128 activations × BLK128x128 weights")
                                   : "unavailable — " + probe.fp8_why_not());
  std::vector<Row> rows;
  for (const Shape& sh : kShapes) bench_shape(sh, copy_gbs, rows);

  Table table({"shape", "M", "kernel µs", "cuBLASLt µs", "kernel / cuBLASLt", "FP8: tiled kernel µs", "fastest", "GB/s",
               "% copy BW", "TFLOP/s", "native FP8 µs (not used)"});
  for (const Row& r : rows) {
    const bool gemm_faster = r.gemm_us && *r.gemm_us < r.kernel_us;
    double best = gemm_faster ? *r.gemm_us : r.kernel_us;
    const bool tiled_faster = r.tiled_us && *r.tiled_us < best;
    if (tiled_faster) best = *r.tiled_us;
    const double gbs = r.bytes / (best * 1e-6) / 1e9;
    table.add({r.shape, fmt::format("{}", r.M), fmt::format("{:.1f}", r.kernel_us),
               r.gemm_us ? fmt::format("{:.1f}", *r.gemm_us) : "n/a",
               r.gemm_us ? fmt::format("{:.2f}×", r.kernel_us / *r.gemm_us) : "n/a",
               r.tiled_us ? fmt::format("{:.1f}", *r.tiled_us) : "-",
               tiled_faster ? "tiled" : gemm_faster ? "cuBLASLt" : "kernel", fmt::format("{:.0f}", gbs),
               fmt::format("{:.1f}%", 100.0 * gbs / copy_gbs), fmt::format("{:.1f}", r.flops / (best * 1e-6) / 1e12),
               r.native_fp8_us ? fmt::format("{:.1f}", *r.native_fp8_us) : "-"});
  }
  table.print(fmt::format("Dense linears, kernel vs cuBLASLt — copy bandwidth {:.0f} GB/s", copy_gbs));
  bench_wo_a(copy_gbs);

  // Where cuBLASLt wins from on (this M and every larger one timed): what linear_gemm.h's row
  // thresholds should be.
  fmt::print("\ncuBLASLt faster from (this M and every larger one timed; now: bf16 from {} rows, the head always, FP8 from {} "
             "or {} by size):\n", cuda::kBf16GemmMinRows, cuda::kFp8GemmMinRowsLarge, cuda::kFp8GemmMinRows);
  for (size_t i = 0; i < rows.size();) {
    size_t j = i;
    while (j < rows.size() && rows[j].shape == rows[i].shape) ++j;
    int from = -1;
    for (size_t k = j; k-- > i;) {
      if (!rows[k].gemm_us || *rows[k].gemm_us >= rows[k].kernel_us) break;
      from = rows[k].M;
    }
    fmt::print("  {}: {}\n", rows[i].shape, from < 0 ? std::string("never (in this table)") : fmt::format("M = {}", from));
    i = j;
  }
}

}  // namespace dsv4::bench
