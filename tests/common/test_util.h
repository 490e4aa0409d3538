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
// The test data folder: $DSV4_TEST_DATA if set, else the build's `built_in`.
std::string test_data_dir(const std::string& built_in);
// Runs the dsv4 binary with `args` (a shell command line fragment); $DSV4_BINARY overrides the
// build's binary.
CommandResult run_dsv4(const std::string& args);
std::string dsv4_binary();  // the binary run_dsv4 runs
struct SplitResult {
  int rc = -1;
  std::string out, err;  // stdout, stderr
};
// The same with stdout and stderr kept apart.
SplitResult run_dsv4_split(const std::string& args);
std::string read_text(const std::string& path);
void write_text(const std::string& path, const std::string& text);
// A fresh empty directory under the build tree's test area.
std::string fresh_dir(const std::string& name);

std::vector<float> floats(const TensorRef& t);  // BF16 or F32 → f32

struct Stats {
  double rel_rms = 0, max_abs = 0, median_abs = 0, argmax = 0, ref_std = 0;
};
// Error statistics of `ours` against `ref`, both [rows, cols] row-major. Throws (a test failure)
// unless both hold the same number of values, a positive multiple of cols.
Stats compare(const std::vector<float>& ours, const std::vector<float>& ref, size_t cols);
// The same for two tensors, which must have the same shape; cols is the last dimension.
Stats compare(const TensorRef& ours, const TensorRef& ref);

}  // namespace dsv4::test
