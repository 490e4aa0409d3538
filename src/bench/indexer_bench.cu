// `dsv4 bench-ops indexer`: lightning-indexer scores (64 heads × 128 dims over FP4 keys) and top-k,
// as CUDA-graph replays over rotating key caches. GB/s and % copy are over the key bytes (68 B per
// key, FP4 layout); TFLOP/s counts 2 · 64 · 128 per key. DSV4_INDEXER_BENCH_SHAPES="1x16384x512"
// (batch x keys x k) restricts the table.
#include <fmt/core.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/indexer_topk.h"
#include "backend/kv_cache_layout.h"
#include "bench/bench_utils.h"
#include "bench/op_benchmarks.h"
#include "core/dtypes.h"

namespace dsv4::bench {
namespace {

namespace kl = dsv4::kv_layout;
using cuda::DeviceBuffer;

struct Shape {
  int batch, keys, k;
};

void bench_shape(const Shape& s, double copy_gbs, Table& table) {
  if (!bench_selected("DSV4_INDEXER_BENCH_SHAPES", fmt::format("{}x{}x{}", s.batch, s.keys, s.k))) return;
  const int T = s.batch;
  const double key_bytes = double(T) * s.keys * kl::kIndexFp4EntryBytes;
  const double flops = 2.0 * T * s.keys * 64 * 128;
  const int rotations = int(std::clamp(200e6 / key_bytes, 2.0, 128.0));
  const int pages_per_seq = (s.keys + kl::kEntriesPerPage - 1) / kl::kEntriesPerPage;
  const size_t pages = size_t(rotations) * T * pages_per_seq;
  // Random FP4 bytes; scales 2^-2 (any finite pattern times the same work).
  std::vector<uint8_t> host(pages * kl::kIndexFp4PageBytes);
  std::mt19937 gen(5);
  for (auto& b : host) b = uint8_t(gen());
  for (size_t p = 0; p < pages; ++p)
    for (int k = 0; k < kl::kEntriesPerPage; ++k)
      for (int i = 0; i < kl::kIndexFp4Scales; ++i)
        host[kl::index_fp4_scale_offset(int64_t(p) * kl::kEntriesPerPage + k) + i] = 125;
  DeviceBuffer<uint8_t> pool(host.size());
  pool.upload(host);
  std::vector<int32_t> table_ids(pages);
  std::iota(table_ids.begin(), table_ids.end(), 0);
  std::shuffle(table_ids.begin(), table_ids.end(), gen);
  DeviceBuffer<int32_t> d_table(table_ids.size());
  d_table.upload(table_ids);
  std::vector<int32_t> seq(T), counts(T, s.keys);
  std::iota(seq.begin(), seq.end(), 0);
  DeviceBuffer<int32_t> d_seq(T), d_counts(T), d_topk(size_t(T) * s.k);
  d_seq.upload(seq);
  d_counts.upload(counts);
  std::vector<uint16_t> q(size_t(rotations) * T * 64 * 128), w(size_t(rotations) * T * 64);
  for (size_t i = 0; i < q.size(); ++i) q[i] = f32_to_bf16(float(int(i * 2654435761u % 13) - 6) / 4.f);
  for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(float(int(i * 40503u % 7) - 3) / 50.f);
  DeviceBuffer<__nv_bfloat16> d_q(q.size()), d_w(w.size());
  d_q.upload(reinterpret_cast<const __nv_bfloat16*>(q.data()), q.size());
  d_w.upload(reinterpret_cast<const __nv_bfloat16*>(w.data()), w.size());
  cuda::IndexerWorkspace ws(T, s.keys);
  DSV4_CUDA_CHECK(cudaDeviceSynchronize());
  auto args_for = [&](int r) {
    cuda::IndexerArgs a;
    a.q = d_q.get() + size_t(r) * T * 64 * 128;
    a.weights = d_w.get() + size_t(r) * T * 64;
    a.key_pool = pool.get();
    a.block_table = d_table.get() + size_t(r) * T * pages_per_seq;
    a.pages_stride = pages_per_seq;
    a.query_seq = d_seq.get();
    a.key_counts = d_counts.get();
    a.num_queries = T;
    a.max_keys = s.keys;
    a.k = s.k;
    a.topk = d_topk.get();
    return a;
  };
  const double total_us = time_graph_us([&](int r, cudaStream_t st) { cuda::indexer_topk(ws, args_for(r), st); },
                                        rotations);
  // Timed last: replaying the scores alone leaves their histograms unconsumed (indexer_topk.h).
  const double score_us = time_graph_us([&](int r, cudaStream_t st) { cuda::indexer_scores(ws, args_for(r), st); },
                                        rotations);
  const int ctas = cuda::indexer_score_ctas(args_for(0));
  auto row = [&](const std::string& what, double us, const std::string& busy) {
    table.add({what, std::to_string(T), std::to_string(s.keys), std::to_string(s.k), fmt::format("{:.2f}", us),
               fmt::format("{:.2f} MB", key_bytes / 1e6), fmt::format("{:.0f}", key_bytes / us / 1e3),
               fmt::format("{:.1f}%", 100.0 * key_bytes / us / 1e3 / copy_gbs), fmt::format("{:.1f}", flops / us / 1e6),
               busy});
  };
  // Top-k: two kernels (count, collect), each one CTA per slice of each query's keys.
  const int topk_ctas = T * ((s.keys + cuda::kIndexerTopkSliceKeys - 1) / cuda::kIndexerTopkSliceKeys);
  row("scores + top-k", total_us, fmt::format("{} + 2 × {}", ctas, topk_ctas));
  row("scores only", score_us, std::to_string(ctas));
  // The top-k kernels consume the histogram the scores kernel leaves (indexer_topk.h), so they cannot
  // be replayed alone: their share is the difference of the two measured rows.
  row("top-k (difference of the rows above)", total_us - score_us, fmt::format("2 × {}", topk_ctas));
}

}  // namespace

void bench_indexer() {
  const double copy_gbs = measure_copy_bandwidth_gbs();
  fmt::print("# bench-ops indexer\n\ndevice-to-device copy {:.0f} GB/s (read + write); 64 heads × 128 dims, FP4 keys "
             "(68 B), bf16 scores; median of CUDA-graph replays over rotating key caches\n", copy_gbs);
  Table table({"stage", "batch", "keys", "k", "time (µs)", "key bytes", "GB/s (keys)", "% copy", "TFLOP/s",
               "CTAs launched"});
  for (const Shape& s : {Shape{1, 16384, 512}, Shape{1, 65536, 512}, Shape{1, 262144, 512}, Shape{8, 16384, 512},
                         Shape{32, 16384, 512}, Shape{1, 16384, 2048}})
    bench_shape(s, copy_gbs, table);
  table.print("Lightning indexer (H200 targets: batch 1 × 16,384 keys incl. top-512 ≤ 15 µs; 262,144 keys ≥ 70% of "
              "copy over key bytes)");
}

}  // namespace dsv4::bench
