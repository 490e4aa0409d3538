// `dsv4 bench-ops attention`: sparse-MLA decode (split-KV + combine) against the unsplit baseline
// (one CTA per (query, 64-head group) over its whole list), timed in the same run as CUDA-graph
// replays over rotating caches (each rotation: its own entries, queries and lists).
// DSV4_ATTN_BENCH_SHAPES="1x1,128x2" (batch x s_q) and DSV4_ATTN_BENCH_VARIANTS="separate,unsplit"
// (substrings of the variant names) restrict the table, e.g. to profile one kernel.
// Bytes = per query (entries read × 584 + q + out); FLOPs = 4 · heads · entries · 512 per query.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/sparse_mla_decode.h"
#include "backend/kv_cache_layout.h"
#include "bench/bench_utils.h"
#include "bench/op_benchmarks.h"
#include "core/dtypes.h"

namespace dsv4::bench {
namespace {

namespace kl = dsv4::kv_layout;
using cuda::DeviceBuffer;

struct Shape {
  std::string name;
  int batch, s_q, compressed;  // compressed entries per query after the 128-entry window
  bool hca;                    // HCA: consecutive entries (all of the sequence); CSA: random selection
};

// Random entries in FP8 layout, written on the device (bf16 random → quantise kernel would also do;
// filling bytes with a valid pattern is enough for timing: scales are set to 2^0).
void fill_pool(DeviceBuffer<uint8_t>& pool, size_t pages) {
  std::vector<uint8_t> page(kl::kKvPageBytes);
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int k = 0; k < kl::kEntriesPerPage; ++k) {
    for (int i = 0; i < kl::kNopeDim; ++i) {
      uint8_t b = uint8_t(byte(gen));
      if ((b & 0x7f) == 0x7f) b = 0x30;  // no NaN codes
      page[kl::kv_entry_data_offset(k) + i] = b;
    }
    for (int i = 0; i < kl::kRopeDim; ++i) {
      const uint16_t h = f32_to_bf16(float(byte(gen) - 128) / 64.f);
      std::memcpy(&page[kl::kv_entry_data_offset(k) + kl::kNopeDim + 2 * i], &h, 2);
    }
    for (int i = 0; i < 8; ++i) page[kl::kv_entry_scale_offset(k) + i] = i < 7 ? 124 : 0;
  }
  for (size_t p = 0; p < pages; ++p)
    DSV4_CUDA_CHECK(cudaMemcpy(pool.get() + p * kl::kKvPageBytes, page.data(), page.size(), cudaMemcpyHostToDevice));
}

void bench_shapes(const std::vector<Shape>& shapes, double copy_gbs, Table& table) {
  std::mt19937 gen(11);
  for (const Shape& s : shapes) {
    if (!bench_selected("DSV4_ATTN_BENCH_SHAPES", fmt::format("{}x{}", s.batch, s.s_q))) continue;
    const int T = s.batch * s.s_q, heads = 64;
    const int stride = 128 + s.compressed;
    const double bytes_per_call = double(T) * (stride * 584.0 + heads * kl::kHeadDim * 2.0 * 2);
    const double flops = 4.0 * T * heads * stride * kl::kHeadDim;
    // Rotations: enough distinct data to exceed L2 several times over, at most 256.
    const int rotations = int(std::clamp(200e6 / bytes_per_call, 2.0, 256.0));
    // Per sequence a region of 128 window + 1024 compressed entries (CSA picks 512 of them).
    const int region = 128 + std::max(1024, s.compressed);
    const size_t entries = size_t(rotations) * s.batch * region;
    const size_t pages = (entries + kl::kEntriesPerPage - 1) / kl::kEntriesPerPage;
    DeviceBuffer<uint8_t> pool(pages * kl::kKvPageBytes);
    fill_pool(pool, pages);
    std::vector<int32_t> lists(size_t(rotations) * T * stride);
    std::vector<int32_t> pick(region - 128);
    for (int r = 0; r < rotations; ++r)
      for (int b = 0; b < s.batch; ++b) {
        const int32_t base = int32_t((size_t(r) * s.batch + b) * region);
        for (int t = 0; t < s.s_q; ++t) {
          int32_t* list = &lists[((size_t(r) * T) + b * s.s_q + t) * stride];
          for (int w = 0; w < 128; ++w) list[w] = base + (w + t) % 128;
          std::iota(pick.begin(), pick.end(), base + 128);
          if (!s.hca) std::shuffle(pick.begin(), pick.end(), gen);
          for (int c = 0; c < s.compressed; ++c) list[128 + c] = pick[c];
        }
      }
    DeviceBuffer<int32_t> d_lists(lists.size());
    d_lists.upload(lists);
    std::vector<uint16_t> q(size_t(rotations) * T * heads * kl::kHeadDim);
    for (size_t i = 0; i < q.size(); ++i) q[i] = f32_to_bf16(float(int(i * 2654435761u % 2001) - 1000) / 500.f);
    DeviceBuffer<__nv_bfloat16> d_q(q.size()), d_out(size_t(T) * heads * kl::kHeadDim);
    d_q.upload(reinterpret_cast<const __nv_bfloat16*>(q.data()), q.size());
    std::vector<float> sink(heads, 0.5f);
    DeviceBuffer<float> d_sink(heads);
    d_sink.upload(sink);
    DSV4_CUDA_CHECK(cudaDeviceSynchronize());

    auto args_for = [&](int r) {
      cuda::SparseMlaArgs a;
      a.q = d_q.get() + size_t(r) * T * heads * kl::kHeadDim;
      a.window_pool = a.compressed_pool = pool.get();
      a.lists = d_lists.get() + size_t(r) * T * stride;
      a.list_stride = stride;
      a.sink = d_sink.get();
      a.out = d_out.get();
      a.num_queries = T;
      return a;
    };
    using K = cuda::SparseMlaKernel;
    struct Variant { std::string name; int hpc, block, warps; bool split, fused; K kernel; bool rounding = false; };
    const std::string sep = "split-KV, separate combine kernel";
    std::vector<Variant> variants = {{"split-KV, fused combine", 0, 0, 0, true, true, K::MmaSync},
                                     // The model's form at up to 16 queries (cuda_backend_attention.cpp):
                                     // 64-entry blocks, pieces from the running maximum before them.
                                     {sep + ", reference rounding (the model's)", 0, 64, 0, true, false, K::Auto,
                                      true},
                                     {sep + " (auto)", 0, 0, 0, true, false, K::Auto},
                                     {sep, 64, 64, 2, true, false, K::MmaSync},
                                     {sep, 64, 64, 4, true, false, K::MmaSync},
                                     {"unsplit baseline (CTA per query × 64 heads)", 64, 64, 4, false, false, K::MmaSync}};
    if (cuda::sparse_mla_wgmma_available())
      variants.insert(variants.begin() + 5, {sep + ", wgmma", 0, 0, 0, true, false, K::Wgmma});
    if (s.batch == 1)  // the tile shapes the auto choice picks among
      variants.insert(variants.begin() + 3, {{sep, 16, 32, 4, true, false, K::MmaSync},
                                             {sep, 32, 32, 4, true, false, K::MmaSync},
                                             {sep, 32, 32, 2, true, false, K::MmaSync},
                                             {sep, 64, 32, 4, true, false, K::MmaSync}});
    double baseline_us = 0;
    std::vector<std::vector<std::string>> rows;
    for (const Variant& v : variants) {
      if (!bench_selected("DSV4_ATTN_BENCH_VARIANTS", v.name, true)) continue;
      cuda::SparseMlaShape shape;
      shape.max_queries = T;
      shape.n_heads = heads;
      shape.heads_per_cta = v.hpc;
      shape.block_entries = v.block;
      shape.row_group_warps = v.warps;
      shape.split_kv = v.split;
      shape.fused_combine = v.fused;
      shape.kernel = v.kernel;
      shape.reference_rounding = v.rounding;
      cuda::SparseMlaPlan plan(shape);
      cuda::Stream st;
      plan.compute(nullptr, T, stride, st.get());
      st.sync();
      const double us = time_graph_us([&](int r, cudaStream_t stream) { sparse_mla_decode(plan, args_for(r), stream); },
                                      rotations);
      // CTAs with work: the plan gives each CTA ceil(units / grid) blocks of 64 entries.
      const int64_t units =
          int64_t(T) * (heads / plan.heads_per_cta()) * ((stride + plan.block_entries() - 1) / plan.block_entries());
      const int64_t per = (units + plan.grid_ctas() - 1) / plan.grid_ctas();
      const int64_t busy = v.split ? (units + per - 1) / per : plan.grid_ctas();
      if (!v.split) baseline_us = us;
      rows.push_back({s.name,
                      v.name + (plan.wgmma() ? std::string(" [wgmma: 64 heads × 64 entries/CTA, 4 warpgroups]")
                                             : fmt::format(" [mma.sync: {} heads × {} entries/CTA, {} warps/16 heads]",
                                                           plan.heads_per_cta(), plan.block_entries(),
                                                           plan.row_group_warps())),
                      std::to_string(s.batch),
                      std::to_string(s.s_q), std::to_string(stride), fmt::format("{:.2f}", us),
                      fmt::format("{:.2f} MB", bytes_per_call / 1e6), fmt::format("{:.0f}", bytes_per_call / us / 1e3),
                      fmt::format("{:.1f}%", 100.0 * bytes_per_call / us / 1e3 / copy_gbs),
                      fmt::format("{:.1f}", flops / us / 1e6), fmt::format("{} ({})", busy, plan.grid_ctas()), ""});
    }
    // The plan kernel alone (once per step and layer kind, shared by its layers).
    {
      cuda::SparseMlaShape shape;
      shape.max_queries = T;
      cuda::SparseMlaPlan plan(shape);
      const double us = time_graph_us([&](int, cudaStream_t stream) { plan.compute(nullptr, T, stride, stream); }, 1);
      rows.push_back({s.name, "plan kernel alone (per step, not per layer)", std::to_string(s.batch),
                      std::to_string(s.s_q), std::to_string(stride), fmt::format("{:.2f}", us), "", "", "", "",
                      "1 (1)", ""});
    }
    for (auto& row : rows) {
      const double us = std::stod(row[5]);
      if (baseline_us > 0 && row[1].rfind("plan", 0) != 0) row[11] = fmt::format("{:.2f}×", baseline_us / us);
      table.add(row);
    }
  }
}

}  // namespace

void bench_attention() {
  const double copy_gbs = measure_copy_bandwidth_gbs();
  int device = 0;
  cudaDeviceProp prop{};
  DSV4_CUDA_CHECK(cudaGetDevice(&device));
  DSV4_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  fmt::print("# bench-ops attention\n\n{} ({} SMs), device-to-device copy {:.0f} GB/s (read + write)\n", prop.name,
             prop.multiProcessorCount, copy_gbs);
  fmt::print("64 heads, head dim 512 (448 e4m3 + 64 bf16 rope), FP8 584-byte entries, sink; time = median of CUDA-graph "
             "replays over rotating caches, per call (decode kernel + combine; the plan is shared by all layers of a "
             "step and timed on its own row)\n");
  Table table({"shape", "variant", "batch", "s_q", "entries/query", "time (µs)", "bytes", "GB/s", "% copy",
               "TFLOP/s", "CTAs busy (launched)", "speed-up vs unsplit"});
  std::vector<Shape> shapes = {
      {"CSA 128 window + 512 selected", 1, 1, 512, false},
      {"CSA 128 window + 512 selected", 1, 2, 512, false},
      {"CSA 128 window + 512 selected", 8, 1, 512, false},
      {"CSA 128 window + 512 selected", 32, 1, 512, false},
      {"CSA 128 window + 512 selected", 128, 1, 512, false},
      {"CSA 128 window + 512 selected", 128, 2, 512, false},
      {"HCA 64K context (128 window + 512 compressed)", 1, 1, 512, true},
      {"HCA 64K context (128 window + 512 compressed)", 32, 1, 512, true},
  };
  bench_shapes(shapes, copy_gbs, table);
  table.print("Sparse MLA decode (H200 targets: batch 1 s_q 1 ≤ 8 µs; batch 128 s_q 2 ≥ 250 TFLOP/s; HCA batch 32 "
              "≥ 60% copy or ≥ 250 TFLOP/s)");
}

}  // namespace dsv4::bench
