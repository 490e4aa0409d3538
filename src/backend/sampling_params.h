// Per-request sampling parameters, as every backend's sample op takes them (the algorithm is
// defined in backend/cpu/sampling_reference.h, which the CUDA kernel reproduces exactly).
#pragma once
#include <cstdint>

namespace dsv4 {

struct SamplingParams {
  float temperature = 0;  // ≤ 0: greedy
  int top_k = 0;          // ≤ 0: off
  float top_p = 1;        // ≥ 1: off
  float min_p = 0;        // ≤ 0: off
  uint64_t seed = 0;
};

}  // namespace dsv4
