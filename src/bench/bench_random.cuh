// Device-side random fill for the benchmarks: a counter hash, so any element's value is a function
// of (index, salt) and buffers fill in one pass with no state.
#pragma once
#include <cstdint>

namespace dsv4::bench {

__device__ inline uint32_t hash32(uint64_t i, uint32_t salt) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + salt;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return uint32_t(x >> 16);
}

}  // namespace dsv4::bench
