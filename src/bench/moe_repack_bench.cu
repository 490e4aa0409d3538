// `dsv4 bench-ops moe-repack`: the load-time repack of one DeepSeek-V4-Flash routed-expert layer
// (256 experts, hidden 4096, inter 2048) into the FP4 kernels' layout, both formats:
//   - GPU kernels: the repack of a layer already staged on the device (median of CUDA-graph replays);
//   - upload: the per-tensor pageable copies into the staging, as prepare_experts makes them;
//   - prepare_experts path: moe_fp4_repack_device from host tensors (chunked staging, one wait);
//   - CPU twin: moe_fp4_repack on the host thread pool.
// GB/s counts the on-disk input bytes (e2m1 weights, scale codes, weight_scale_2). The GPU output is
// compared with the CPU's byte for byte.
#include <fmt/core.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/moe_fp4.h"
#include "backend/cuda/moe_fp4_repack.h"
#include "bench/bench_utils.h"
#include "bench/op_benchmarks.h"
#include "core/thread_pool.h"

namespace dsv4::bench {
namespace {

__device__ uint32_t repack_bench_hash(uint64_t i, uint32_t salt) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + salt;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return uint32_t(x >> 16);
}

// Random on-disk tensors: any e2m1 byte; scale codes as a checkpoint has them (MXFP4 2^-9..2^-4,
// NVFP4 any positive finite e4m3).
__global__ void fill_raw_weights(uint8_t* p, size_t n, uint32_t salt) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint8_t(repack_bench_hash(i, salt));
}
__global__ void fill_raw_codes(uint8_t* p, size_t n, uint32_t salt, bool mxfp4) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t h = repack_bench_hash(i, salt);
    p[i] = mxfp4 ? uint8_t(118 + h % 6) : uint8_t(1 + h % 0x7e);
  }
}
__global__ void fill_raw_scale_2(float* p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = 1e-4f * float(1 + i % 7);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::vector<uint8_t> to_host(const void* device, size_t bytes) {
  std::vector<uint8_t> host(bytes);
  if (bytes) DSV4_CUDA_CHECK(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost));
  return host;
}

template <typename T>
bool same_bytes(const std::vector<T>& cpu, const void* device) {
  const size_t bytes = cpu.size() * sizeof(T);
  if (bytes && !device) return false;
  return std::memcmp(to_host(device, bytes).data(), cpu.data(), bytes) == 0;
}

bool same_repack(const cuda::MoeFp4Weights& w, const MoeFp4Repacked& rp) {
  return same_bytes(rp.gate_up, w.gate_up()) && same_bytes(rp.gate_up_scales, w.gate_up_scales()) &&
         same_bytes(rp.down, w.down()) && same_bytes(rp.down_scales, w.down_scales()) &&
         same_bytes(rp.factors, w.factors()) && same_bytes(rp.w4a8_gate_up_index, w.w4a8_gate_up_index()) &&
         same_bytes(rp.w4a8_down_index, w.w4a8_down_index()) &&
         same_bytes(rp.w4a8_gate_up_row_scale, w.w4a8_gate_up_row_scale()) &&
         same_bytes(rp.w4a8_down_row_scale, w.w4a8_down_row_scale());
}

void bench_repack_format(MoeFp4Format format, double copy_gbs, Table& table) {
  MoeFp4Shape shape;
  shape.format = format, shape.experts = 256, shape.hidden = 4096, shape.inter = 2048;
  const int E = shape.experts;
  const bool mx = format == MoeFp4Format::Mxfp4;
  const char* name = mx ? "MXFP4" : "NVFP4";
  const double input_bytes = double(E) * double(cuda::MoeFp4Staging::bytes_per_expert(shape));
  cuda::Stream stream;

  // The whole layer staged, filled on the device; its host copy is the loader's input.
  cuda::MoeFp4Staging staged(shape, E);
  const size_t weights_bytes = size_t(E) * staged.matrix_bytes(), codes_bytes = size_t(E) * staged.scale_bytes();
  for (int m = 0; m < 3; ++m) {
    fill_raw_weights<<<4096, 256, 0, stream.get()>>>(staged.packed(m), weights_bytes, 11 + m);
    fill_raw_codes<<<1024, 256, 0, stream.get()>>>(staged.scales(m), codes_bytes, 21 + m, mx);
  }
  fill_raw_scale_2<<<(3 * E + 255) / 256, 256, 0, stream.get()>>>(staged.scale_2(), 3 * E);
  DSV4_CUDA_CHECK_LAUNCH();
  stream.sync();
  staged.set_staged(0, E);
  std::vector<std::vector<uint8_t>> host_packed, host_codes;
  for (int m = 0; m < 3; ++m) {
    host_packed.push_back(to_host(staged.packed(m), weights_bytes));
    host_codes.push_back(to_host(staged.scales(m), codes_bytes));
  }
  std::vector<float> host_scale_2(size_t(3) * E);
  DSV4_CUDA_CHECK(cudaMemcpy(host_scale_2.data(), staged.scale_2(), host_scale_2.size() * sizeof(float),
                             cudaMemcpyDeviceToHost));
  std::vector<MoeFp4ExpertTensors> views(E);
  for (int e = 0; e < E; ++e) {
    const size_t w = size_t(e) * staged.matrix_bytes(), s = size_t(e) * staged.scale_bytes();
    views[e] = {host_packed[0].data() + w, host_codes[0].data() + s, host_packed[1].data() + w,
                host_codes[1].data() + s, host_packed[2].data() + w, host_codes[2].data() + s,
                host_scale_2[size_t(e) * 3], host_scale_2[size_t(e) * 3 + 1], host_scale_2[size_t(e) * 3 + 2]};
  }

  // GPU kernels on the staged layer.
  cuda::MoeFp4Weights weights = cuda::MoeFp4Weights::allocate(shape);
  cuda::MoeFp4RepackStatus status;
  status.reset(stream.get());
  const double kernels_us = time_graph_us(
      [&](int, cudaStream_t s) { cuda::moe_fp4_repack_enqueue(staged, weights, status, s); }, 1, 10);
  status.check(views, stream.get());

  // The upload alone (pageable, one copy per tensor), then the loader's whole path.
  auto start = std::chrono::steady_clock::now();
  staged.upload(views, 0, E, stream.get());
  stream.sync();
  const double upload_s = seconds_since(start);
  double device_path_s = 0;
  for (int run = 0; run < 2; ++run) {  // the first run also pays the staging allocation's first touch
    start = std::chrono::steady_clock::now();
    cuda::moe_fp4_repack_device(views, weights, stream.get());
    device_path_s = seconds_since(start);
  }

  start = std::chrono::steady_clock::now();
  const MoeFp4Repacked cpu = moe_fp4_repack(shape, views);
  const double cpu_s = seconds_since(start);
  const bool identical = same_repack(weights, cpu);

  const double kernels_s = kernels_us * 1e-6;
  auto row = [&](const std::string& step, double s) {
    table.add({name, step, fmt::format("{:.2f}", s * 1e3), fmt::format("{:.2f}", input_bytes / 1e9),
               fmt::format("{:.1f}", input_bytes / s / 1e9), fmt::format("{:.1f}×", cpu_s / s)});
  };
  row("GPU kernels (layer staged)", kernels_s);
  row("upload (pageable, per tensor)", upload_s);
  row("prepare_experts path (upload + repack + wait)", device_path_s);
  row(fmt::format("CPU twin ({} threads)", ThreadPool::global().size()), cpu_s);
  // Traffic of the kernels: input read, output written (every MoeFp4Weights byte).
  const double output_bytes = double(cpu.gate_up.size() + cpu.gate_up_scales.size() + cpu.down.size() +
                                     cpu.down_scales.size() + cpu.w4a8_gate_up_index.size() + cpu.w4a8_down_index.size()) +
                              4.0 * double(cpu.factors.size() + cpu.w4a8_gate_up_row_scale.size() +
                                           cpu.w4a8_down_row_scale.size());
  fmt::print("{}: GPU output {} the CPU twin's; kernels move {:.2f} GB in + {:.2f} GB out = {:.0f}% of the copy "
             "bandwidth; {} W4A8 groups rounded\n",
             name, identical ? "identical to" : "DIFFERS FROM", input_bytes / 1e9, output_bytes / 1e9,
             100.0 * (input_bytes + output_bytes) / kernels_s / 1e9 / copy_gbs, cpu.w4a8_rounded_groups);
}

}  // namespace

void bench_moe_repack() {
  const double copy_gbs = measure_copy_bandwidth_gbs();
  fmt::print("device-to-device copy bandwidth: {:.0f} GB/s (read + write)\n", copy_gbs);
  // DSV4_MOE_BENCH_FORMAT=mxfp4|nvfp4 times one format only (default: both).
  const char* only = std::getenv("DSV4_MOE_BENCH_FORMAT");
  const std::string fmt_only = only ? only : "";
  if (!fmt_only.empty() && fmt_only != "mxfp4" && fmt_only != "nvfp4")
    fail("DSV4_MOE_BENCH_FORMAT: expected mxfp4 or nvfp4, got '{}'", fmt_only);
  Table table({"format", "step", "time ms", "input GB", "GB/s of input", "speed-up vs CPU"});
  if (fmt_only.empty() || fmt_only == "mxfp4") bench_repack_format(MoeFp4Format::Mxfp4, copy_gbs, table);
  if (fmt_only.empty() || fmt_only == "nvfp4") bench_repack_format(MoeFp4Format::Nvfp4, copy_gbs, table);
  table.print("MoE FP4 load-time repack — one DeepSeek-V4-Flash layer (E 256, D 4096, I 2048)");
}

}  // namespace dsv4::bench
