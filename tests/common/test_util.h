// Helpers for tests that run the dsv4 binary and read the safetensors it writes.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"

namespace dsv4::test {

struct CommandResult {
  int rc = -1;      // exit status
  std::string out;  // stdout and stderr together
};
// Runs the dsv4 binary with `args` (a shell command line fragment).
CommandResult run_dsv4(const std::string& args);
std::string read_text(const std::string& path);
void write_text(const std::string& path, const std::string& text);
// A fresh empty directory under the build tree's test area.
std::string fresh_dir(const std::string& name);

std::vector<float> floats(const TensorRef& t);  // BF16 or F32 → f32

struct Stats {
  double rel_rms = 0, max_abs = 0, median_abs = 0, argmax = 0, ref_std = 0;
};
// Error statistics of `ours` against `ref`, both [rows, cols] row-major.
Stats compare(const std::vector<float>& ours, const std::vector<float>& ref, size_t cols);

}  // namespace dsv4::test
