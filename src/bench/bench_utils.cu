#include "bench/bench_utils.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/cuda_utils.h"

namespace dsv4::bench {

double measure_copy_bandwidth_gbs(size_t bytes) {
  cuda::DeviceBuffer<uint8_t> src(bytes), dst(bytes);
  src.fill_bytes(1);
  cuda::Stream stream;
  cuda::Event start, stop;
  std::vector<float> ms;
  for (int i = 0; i < 12; ++i) {
    start.record(stream.get());
    DSV4_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream.get()));
    stop.record(stream.get());
    if (i >= 2) ms.push_back(stop.elapsed_ms_since(start));
  }
  std::sort(ms.begin(), ms.end());
  double med = ms[ms.size() / 2];
  return 2.0 * double(bytes) / (med * 1e-3) / 1e9;
}

double time_graph_us(const std::function<void(int, cudaStream_t)>& variant, int rotations, int replays) {
  cuda::Stream stream;
  // Warm up outside the graph (module load, lazy init, first-touch).
  for (int k = 0; k < rotations; ++k) variant(k, stream.get());
  stream.sync();
  cuda::Graph graph;
  graph.capture(stream.get(), [&](cudaStream_t s) {
    for (int k = 0; k < rotations; ++k) variant(k, s);
  });
  graph.launch(stream.get());
  stream.sync();
  cuda::Event start, stop;
  std::vector<float> ms;
  for (int r = 0; r < replays; ++r) {
    start.record(stream.get());
    graph.launch(stream.get());
    stop.record(stream.get());
    ms.push_back(stop.elapsed_ms_since(start));
  }
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]) * 1e3 / rotations;
}

bool bench_selected(const char* env_name, const std::string& key, bool substring) {
  const char* env = std::getenv(env_name);
  if (!env || !*env) return true;
  const std::string list(env);
  for (size_t begin = 0; begin <= list.size();) {
    const size_t end = std::min(list.find(',', begin), list.size());
    const std::string item = list.substr(begin, end - begin);
    if (!item.empty() && (substring ? key.find(item) != std::string::npos : key == item)) return true;
    begin = end + 1;
  }
  return false;
}

void Table::print(const std::string& title) const {
  fmt::print("\n### {}\n\n|", title);
  for (auto& h : header_) fmt::print(" {} |", h);
  fmt::print("\n|");
  for (size_t i = 0; i < header_.size(); ++i) fmt::print("---|");
  fmt::print("\n");
  for (auto& r : rows_) {
    fmt::print("|");
    for (auto& c : r) fmt::print(" {} |", c);
    fmt::print("\n");
  }
  std::fflush(stdout);
}

}  // namespace dsv4::bench
