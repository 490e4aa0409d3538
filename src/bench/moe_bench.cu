// `dsv4 bench-ops moe`: the FP4 MoE forward (route + gate-up + SwiGLU + down + combine) on
// DeepSeek-V4-Flash routed-expert shapes, uniform random routing, both weight formats.
// Per token count: median of CUDA-graph replays over rotating routing/input sets (each set touches its
// own experts of a 3 GB layer, far beyond L2), distinct experts touched, bytes, GB/s, % of the copy
// bandwidth measured in this run, TFLOP/s, and the ratio to a cuBLAS bf16 baseline timed in the same
// run (the same experts dequantised to bf16, one GEMM per touched expert and matrix).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <fmt/core.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <set>
#include <vector>

#include "backend/cuda/moe_fp4.h"
#include "bench/bench_random.cuh"
#include "bench/bench_utils.h"
#include "bench/op_benchmarks.h"
#include "core/dtypes.h"

namespace dsv4::bench {
namespace {

using cuda::DeviceBuffer;

#define DSV4_CUBLAS_CHECK(expr)                                                  \
  do {                                                                           \
    cublasStatus_t st_ = (expr);                                                 \
    if (st_ != CUBLAS_STATUS_SUCCESS) fail("cuBLAS error {} at {}:{}", int(st_), __FILE__, __LINE__); \
  } while (0)

// Random weights straight in the unit layout (every e2m1 code; plausible scale bytes).
__global__ void fill_random_bytes(uint8_t* p, size_t n, uint32_t salt) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint8_t(hash32(i, salt));
}
__global__ void fill_random_scales(uint8_t* p, size_t n, uint32_t salt, bool mxfp4) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = hash32(i, salt);
    // MXFP4 byte = bf16 exponent field of the folded scale; NVFP4 byte = (exponent − 224) << 3 | mantissa.
    p[i] = mxfp4 ? uint8_t(240 + h % 8) : uint8_t(((20 + h % 8) << 3) | ((h >> 8) & 7));
  }
}
__global__ void fill_random_w4a8_index(uint8_t* p, size_t n, uint32_t salt) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint8_t(kW4a8Tables - 1 - hash32(i, salt) % 6);
}
__global__ void fill_value(float* p, int n, float v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}

// Unit layout → row-major bf16 (gate-up rows: w1 then w3), for the cuBLAS baseline.
template <MoeFp4Format F>
__global__ void dequant_units_to_bf16(const uint8_t* w, const uint8_t* s, const float* factors, int factor_index,
                                      int rows, int cols, bool gate_up, size_t units_total, __nv_bfloat16* out) {
  size_t gid = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (gid >= units_total * 32) return;
  const int lane = int(gid % 32);
  const size_t unit = gid / 32;
  const size_t units_per_expert = size_t(rows / 16) * (cols / 64);
  const int e = int(unit / units_per_expert);
  const size_t ue = unit % units_per_expert;
  const int rt = int(ue / (cols / 64)), kc = int(ue % (cols / 64));
  const int g = lane / 4, q = lane % 4;
  const uint8_t* wl = w + unit * kMoeUnitBytes + lane * 16;
  const uint8_t* sl = s + unit * moe_unit_scale_bytes(F) + (F == MoeFp4Format::Nvfp4 ? 2 * lane : 4 * g + 2 * (q >> 1));
  for (int h = 0; h < 2; ++h) {
    uint32_t code = sl[h];
    uint32_t sbits = F == MoeFp4Format::Mxfp4 ? code << 7 : (code << 4) + (224u << 7);
    float scale = __uint_as_float(sbits << 16) * factors[e * kFactorsPerExpert + (gate_up ? (h ? kUpFactor : kGateFactor) : factor_index)];
    int r16 = g + 8 * h;
    size_t row = gate_up ? (r16 < 8 ? size_t(rt) * 8 + r16 : size_t(rows / 2) + size_t(rt) * 8 + r16 - 8) : size_t(rt) * 16 + r16;
    __nv_bfloat16* orow = out + (size_t(e) * rows + row) * cols + kc * 64;
    for (int t = 0; t < 4; ++t)
      for (int i = 0; i < 8; ++i) {
        int reg = i & 3, hi = i >> 2;
        if ((reg & 1) != h) continue;
        int col = 16 * q + 4 * t + 2 * (reg >> 1) + hi;
        uint32_t nib = (wl[t * 4 + i / 2] >> (4 * (i & 1))) & 15;
        uint32_t wbits = ((nib & 7) << 6) | ((nib & 8) << 12);
        orow[col] = __float2bfloat16_rn(__uint_as_float(wbits << 16) * scale);
      }
  }
}

// DSV4_MOE_BENCH_TOKENS="1,4,16" times only those token counts (default: the full table);
// DSV4_MOE_BENCH_PATH=stream|decode|batched|w4a8[,…] times those kernel paths instead of the dispatcher's.
std::vector<int> token_counts() {
  std::vector<int> counts;
  if (const char* env = std::getenv("DSV4_MOE_BENCH_TOKENS")) {
    for (const char* c = env; *c;) {
      char* end = nullptr;
      long v = std::strtol(c, &end, 10);
      if (end == c) fail("DSV4_MOE_BENCH_TOKENS: expected comma-separated token counts, got '{}'", env);
      if (v > 0) counts.push_back(int(v));
      c = *end == ',' ? end + 1 : end;
    }
  }
  if (counts.empty()) counts = {1, 4, 16, 64, 256, 1024, 8192};
  return counts;
}

// The paths timed at one token count: DSV4_MOE_BENCH_PATH (comma-separated) if set, else the
// dispatcher's choice and, from 1024 tokens on, the other large-batch path where it can run (both
// prefill paths in one table).
std::vector<cuda::MoeFp4Path> paths_for(const MoeFp4Shape& shape, int tokens, int k) {
  std::vector<cuda::MoeFp4Path> paths;
  if (const char* env = std::getenv("DSV4_MOE_BENCH_PATH"); env && *env) {
    std::string list(env);
    for (size_t pos = 0; pos <= list.size();) {
      size_t end = std::min(list.find(',', pos), list.size());
      std::string v = list.substr(pos, end - pos);
      pos = end + 1;
      if (v == "stream") paths.push_back(cuda::MoeFp4Path::W4A16Stream);
      else if (v == "decode") paths.push_back(cuda::MoeFp4Path::W4A16Decode);
      else if (v == "batched") paths.push_back(cuda::MoeFp4Path::W4A16Batched);
      else if (v == "w4a8") paths.push_back(cuda::MoeFp4Path::W4A8);
      else fail("DSV4_MOE_BENCH_PATH: unknown path '{}' (stream, decode, batched or w4a8)", v);
    }
  } else {
    paths.push_back(cuda::moe_fp4_select_path(shape, tokens, k));
    if (tokens >= 1024)
      for (auto other : {cuda::MoeFp4Path::W4A16Batched, cuda::MoeFp4Path::W4A8})
        if (other != paths[0]) paths.push_back(other);
  }
  paths.erase(std::remove_if(paths.begin(), paths.end(),
                             [&](cuda::MoeFp4Path p) { return !cuda::moe_fp4_path_available(p, shape); }),
              paths.end());
  return paths;
}

struct RoutingSet {
  DeviceBuffer<int32_t> ids;
  DeviceBuffer<float> weights;
  DeviceBuffer<uint16_t> x, shared, out;
  std::vector<std::pair<int, int>> expert_tokens;  // (expert, tokens routed to it)
};

struct Row {
  int tokens;
  double moe_us, cublas_us, distinct, bytes;
  const char* path;
};

void bench_format(MoeFp4Format format, double copy_gbs) {
  MoeFp4Shape shape;
  shape.format = format, shape.experts = 256, shape.hidden = 4096, shape.inter = 2048;
  const int k = 6, D = shape.hidden, I = shape.inter, E = shape.experts;
  const bool mx = format == MoeFp4Format::Mxfp4;
  cuda::MoeFp4Weights weights = cuda::MoeFp4Weights::allocate(shape);
  cuda::Stream stream;
  const size_t gu_bytes = size_t(E) * 2 * I * D / 2, dn_bytes = size_t(E) * D * I / 2;
  const size_t sb = moe_unit_scale_bytes(format);
  fill_random_bytes<<<4096, 256, 0, stream.get()>>>(weights.mutable_gate_up(), gu_bytes, 1);
  fill_random_bytes<<<4096, 256, 0, stream.get()>>>(weights.mutable_down(), dn_bytes, 2);
  fill_random_scales<<<4096, 256, 0, stream.get()>>>(weights.mutable_gate_up_scales(), gu_bytes / kMoeUnitBytes * sb, 3, mx);
  fill_random_scales<<<4096, 256, 0, stream.get()>>>(weights.mutable_down_scales(), dn_bytes / kMoeUnitBytes * sb, 4, mx);
  fill_value<<<(E * 3 + 255) / 256, 256, 0, stream.get()>>>(weights.mutable_factors(), E * 3, mx ? 1.f : 4e-3f);
  if (weights.has_w4a8()) {
    // W4A8 tables for row scale spreads of 2^0..2^5 (moe_fp4.h), and their row factors.
    fill_random_w4a8_index<<<4096, 256, 0, stream.get()>>>(weights.mutable_w4a8_gate_up_index(), gu_bytes / kMoeUnitBytes * sb, 5);
    fill_random_w4a8_index<<<4096, 256, 0, stream.get()>>>(weights.mutable_w4a8_down_index(), dn_bytes / kMoeUnitBytes * sb, 6);
    fill_value<<<(E * 2 * I + 255) / 256, 256, 0, stream.get()>>>(weights.mutable_w4a8_gate_up_row_scale(), E * 2 * I, 1e-3f);
    fill_value<<<(E * D + 255) / 256, 256, 0, stream.get()>>>(weights.mutable_w4a8_down_row_scale(), E * D, 1e-3f);
  }
  DSV4_CUDA_CHECK_LAUNCH();

  // bf16 copies for the baseline: gate-up [E, 2I, D], down [E, D, I].
  DeviceBuffer<__nv_bfloat16> gu16(size_t(E) * 2 * I * D), dn16(size_t(E) * D * I);
  {
    size_t gu_units = gu_bytes / kMoeUnitBytes, dn_units = dn_bytes / kMoeUnitBytes;
    auto launch = [&](auto kernel) {
      kernel<<<(gu_units * 32 + 255) / 256, 256, 0, stream.get()>>>(weights.gate_up(), weights.gate_up_scales(),
                                                                    weights.factors(), 0, 2 * I, D, true, gu_units, gu16.get());
      kernel<<<(dn_units * 32 + 255) / 256, 256, 0, stream.get()>>>(weights.down(), weights.down_scales(), weights.factors(),
                                                                    int(kDownFactor), D, I, false, dn_units, dn16.get());
    };
    if (mx) launch(dequant_units_to_bf16<MoeFp4Format::Mxfp4>);
    else launch(dequant_units_to_bf16<MoeFp4Format::Nvfp4>);
    DSV4_CUDA_CHECK_LAUNCH();
    stream.sync();
  }

  cublasHandle_t cublas;
  DSV4_CUBLAS_CHECK(cublasCreate(&cublas));
  DeviceBuffer<uint8_t> cublas_ws(size_t(64) << 20);
  DSV4_CUBLAS_CHECK(cublasSetWorkspace(cublas, cublas_ws.get(), cublas_ws.bytes()));

  std::mt19937 rng(20261130);
  std::vector<Row> rows;
  for (int tokens : token_counts()) {
    const int rotations = tokens <= 64 ? 8 : tokens <= 1024 ? 4 : 2;
    std::vector<RoutingSet> sets(rotations);
    double distinct = 0;
    int max_per_expert = 1;
    for (auto& set : sets) {
      std::vector<int32_t> ids;
      std::vector<float> w;
      std::vector<int> perm(E), per_expert(E, 0);
      std::uniform_real_distribution<float> wd(0.05f, 0.5f), xd(-1.f, 1.f);
      for (int t = 0; t < tokens; ++t) {
        for (int e = 0; e < E; ++e) perm[e] = e;
        for (int j = 0; j < k; ++j) {
          std::swap(perm[j], perm[j + rng() % (E - j)]);
          ids.push_back(perm[j]);
          w.push_back(wd(rng));
          per_expert[perm[j]]++;
        }
      }
      for (int e = 0; e < E; ++e)
        if (per_expert[e]) set.expert_tokens.push_back({e, per_expert[e]}), max_per_expert = std::max(max_per_expert, per_expert[e]);
      distinct += double(set.expert_tokens.size()) / rotations;
      std::vector<uint16_t> x(size_t(tokens) * D), sh(size_t(tokens) * D);
      for (auto& v : x) v = f32_to_bf16(xd(rng));
      for (auto& v : sh) v = f32_to_bf16(xd(rng) * 0.1f);
      set.ids = DeviceBuffer<int32_t>(ids.size());
      set.ids.upload(ids, stream.get());
      set.weights = DeviceBuffer<float>(w.size());
      set.weights.upload(w, stream.get());
      set.x = DeviceBuffer<uint16_t>(x.size());
      set.x.upload(x, stream.get());
      set.shared = DeviceBuffer<uint16_t>(sh.size());
      set.shared.upload(sh, stream.get());
      set.out = DeviceBuffer<uint16_t>(x.size());
    }
    stream.sync();
    cuda::MoeWorkspace ws(shape, tokens, k);
    std::vector<std::pair<cuda::MoeFp4Path, double>> timed;
    for (cuda::MoeFp4Path path : paths_for(shape, tokens, k))
      timed.push_back({path, time_graph_us(
                                 [&](int r, cudaStream_t s) {
                                   RoutingSet& set = sets[r];
                                   cuda::moe_fp4_forward_path(path, weights, set.x.get(), tokens, set.ids.get(),
                                                              set.weights.get(), k, set.shared.get(), set.out.get(),
                                                              ws, s);
                                 },
                                 rotations)});

    // Baseline: per touched expert, [n, D]·[D, 2I] then [n, I]·[I, D] (bf16 in/out, f32 accumulate).
    DeviceBuffer<__nv_bfloat16> bx(size_t(max_per_expert) * D), bc(size_t(max_per_expert) * 2 * I),
        by(size_t(max_per_expert) * D);
    DSV4_CUDA_CHECK(cudaMemsetAsync(bx.get(), 0x3c, bx.bytes(), stream.get()));
    double cublas_us = time_graph_us(
        [&](int r, cudaStream_t s) {
          DSV4_CUBLAS_CHECK(cublasSetStream(cublas, s));
          const float one = 1.f, zero = 0.f;
          for (auto [e, n] : sets[r].expert_tokens) {
            DSV4_CUBLAS_CHECK(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, 2 * I, n, D, &one,
                                           gu16.get() + size_t(e) * 2 * I * D, CUDA_R_16BF, D, bx.get(), CUDA_R_16BF, D,
                                           &zero, bc.get(), CUDA_R_16BF, 2 * I, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            DSV4_CUBLAS_CHECK(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, D, n, I, &one,
                                           dn16.get() + size_t(e) * D * I, CUDA_R_16BF, I, bc.get(), CUDA_R_16BF, 2 * I,
                                           &zero, by.get(), CUDA_R_16BF, D, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
          }
        },
        rotations);
    double bytes = distinct * double(weights.expert_bytes()) + 3.0 * tokens * D * 2;
    for (auto [path, moe_us] : timed)
      rows.push_back({tokens, moe_us, cublas_us, distinct, bytes, cuda::moe_fp4_path_name(path)});
  }
  DSV4_CUBLAS_CHECK(cublasDestroy(cublas));

  Table table({"tokens", "path", "time µs", "experts touched", "bytes MB", "GB/s", "% copy BW", "TFLOP/s",
               "cuBLAS bf16 µs", "speed-up vs cuBLAS"});
  for (const Row& r : rows) {
    double gbs = r.bytes / (r.moe_us * 1e-6) / 1e9;
    double tflops = 2.0 * r.tokens * k * 3.0 * D * I / (r.moe_us * 1e-6) / 1e12;
    table.add({fmt::format("{}", r.tokens), r.path, fmt::format("{:.1f}", r.moe_us), fmt::format("{:.1f}", r.distinct),
               fmt::format("{:.1f}", r.bytes / 1e6), fmt::format("{:.0f}", gbs),
               fmt::format("{:.1f}%", 100.0 * gbs / copy_gbs), fmt::format("{:.1f}", tflops),
               fmt::format("{:.1f}", r.cublas_us), fmt::format("{:.2f}×", r.cublas_us / r.moe_us)});
  }
  table.print(fmt::format("MoE FP4 ({}) — E {} D {} I {} top-{}, copy bandwidth {:.0f} GB/s", mx ? "MXFP4" : "NVFP4",
                          E, D, I, k, copy_gbs));
}

}  // namespace

void bench_moe() {
  double copy_gbs = measure_copy_bandwidth_gbs();
  fmt::print("device-to-device copy bandwidth: {:.0f} GB/s (read + write)\n", copy_gbs);
  fmt::print("bytes = distinct experts × expert bytes (e2m1 + scales) + x, shared and out; time = median of 50\n"
             "CUDA-graph replays, each over several routing sets; fused = route + gate-up + SwiGLU + down + combine\n");
  // DSV4_MOE_BENCH_FORMAT=mxfp4|nvfp4 times one format only (default: both).
  const char* only = std::getenv("DSV4_MOE_BENCH_FORMAT");
  const std::string fmt_only = only ? only : "";
  if (!fmt_only.empty() && fmt_only != "mxfp4" && fmt_only != "nvfp4")
    fail("DSV4_MOE_BENCH_FORMAT: expected mxfp4 or nvfp4, got '{}'", fmt_only);
  if (fmt_only.empty() || fmt_only == "mxfp4") bench_format(MoeFp4Format::Mxfp4, copy_gbs);
  if (fmt_only.empty() || fmt_only == "nvfp4") bench_format(MoeFp4Format::Nvfp4, copy_gbs);
}

}  // namespace dsv4::bench
