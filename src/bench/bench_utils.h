// Shared helpers of the GPU op benchmarks: the copy-bandwidth ceiling measured in the same run,
// median timing of CUDA-graph replays, and markdown tables.
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <vector>

namespace dsv4::bench {

// Device-to-device copy bandwidth in GB/s (bytes read + bytes written), median of several
// cudaMemcpyAsync calls over a buffer far larger than L2.
double measure_copy_bandwidth_gbs(size_t bytes = size_t(2) << 30);

// Median microseconds of one replay of `variant(k, stream)` for k = 0..rotations-1 (each k uses
// its own input set, so L2 does not hold the data between replays). The work for all k is captured
// in one CUDA graph, replayed `replays` times; the median over replays is divided by `rotations`.
double time_graph_us(const std::function<void(int, cudaStream_t)>& variant, int rotations, int replays = 50);

// Benchmark filters from the environment: true when `env_name` is unset or empty, or when one of its
// comma-separated items equals `key` (or, with `substring`, occurs in it). Lets one profiler run
// target a single shape or variant, e.g. DSV4_ATTN_BENCH_SHAPES=128x2.
bool bench_selected(const char* env_name, const std::string& key, bool substring = false);

// A markdown table printed to stdout.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(const std::string& title) const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace dsv4::bench
