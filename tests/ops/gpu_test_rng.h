// Fresh random inputs on every run: one generator per test binary, seeded from the system and
// printed, so a failure can be replayed.
#pragma once
#include <cstdio>
#include <random>

namespace dsv4::test {

inline std::mt19937& fresh_rng(const char* test_binary) {
  static std::mt19937 gen = [&] {
    const unsigned seed = std::random_device{}();
    std::printf("%s seed %u\n", test_binary, seed);
    return std::mt19937(seed);
  }();
  return gen;
}

}  // namespace dsv4::test
