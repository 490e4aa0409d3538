#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <unistd.h>

namespace dsv4::test {

namespace fs = std::filesystem;

namespace {
// The build tree's paths, unless the environment says otherwise (test binaries run on a GPU
// machine from another folder: DSV4_BINARY, DSV4_TEST_TMP).
std::string from_env(const char* name, const char* built_in) {
  const char* v = std::getenv(name);
  return v && *v ? v : built_in;
}
std::string test_tmp() { return from_env("DSV4_TEST_TMP", DSV4_TEST_TMP); }
}  // namespace

std::string test_data_dir(const std::string& built_in) { return from_env("DSV4_TEST_DATA", built_in.c_str()); }

std::string dsv4_binary() { return from_env("DSV4_BINARY", DSV4_BINARY); }

CommandResult run_dsv4(const std::string& args) {
  static int counter = 0;
  const std::string log = (fs::path(test_tmp()) / ("command." + std::to_string(::getpid()) + "." +
                                                   std::to_string(counter++) + ".log")).string();
  fs::create_directories(test_tmp());
  int rc = std::system((dsv4_binary() + " " + args + " >" + log + " 2>&1").c_str());
  CommandResult r{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_text(log)};
  fs::remove(log);
  return r;
}

SplitResult run_dsv4_split(const std::string& args) {
  static int counter = 0;
  const std::string base = (fs::path(test_tmp()) / ("split." + std::to_string(::getpid()) + "." + std::to_string(counter++))).string();
  fs::create_directories(test_tmp());
  int rc = std::system((dsv4_binary() + " " + args + " >" + base + ".out 2>" + base + ".err").c_str());
  SplitResult r{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_text(base + ".out"), read_text(base + ".err")};
  fs::remove(base + ".out");
  fs::remove(base + ".err");
  return r;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string fresh_dir(const std::string& name) {
  fs::path p = fs::path(test_tmp()) / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::vector<float> floats(const TensorRef& t) {
  std::vector<float> v(size_t(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = t.dtype == DType::BF16 ? bf16_to_f32(t.as<uint16_t>()[i]) : t.as<float>()[i];
  return v;
}

Stats compare(const std::vector<float>& ours, const std::vector<float>& ref, size_t cols) {
  // Sizes first: the loops below read ours.size() values of both sides.
  if (ours.size() != ref.size() || ref.empty() || cols == 0 || ref.size() % cols != 0)
    throw std::invalid_argument("compare: " + std::to_string(ours.size()) + " values against " +
                                std::to_string(ref.size()) + " (rows of " + std::to_string(cols) + ")");
  Stats s;
  double num = 0, den = 0, mean = 0;
  std::vector<float> abs(ours.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    double e = double(ours[i]) - ref[i];
    num += e * e;
    den += double(ref[i]) * ref[i];
    abs[i] = float(std::fabs(e));
    s.max_abs = std::max(s.max_abs, double(abs[i]));
    mean += ref[i];
  }
  mean /= double(ref.size());
  double var = 0;
  for (float r : ref) var += (r - mean) * (r - mean);
  s.ref_std = std::sqrt(var / double(ref.size()));
  s.rel_rms = std::sqrt(num / den);
  std::nth_element(abs.begin(), abs.begin() + long(abs.size() / 2), abs.end());
  s.median_abs = abs[abs.size() / 2];
  size_t rows = ours.size() / cols, agree = 0;
  for (size_t r = 0; r < rows; ++r)
    agree += std::max_element(ours.begin() + long(r * cols), ours.begin() + long((r + 1) * cols)) - ours.begin() ==
             std::max_element(ref.begin() + long(r * cols), ref.begin() + long((r + 1) * cols)) - ref.begin();
  s.argmax = double(agree) / double(rows);
  return s;
}

Stats compare(const TensorRef& ours, const TensorRef& ref) {
  if (ours.shape != ref.shape || ref.shape.empty())
    throw std::invalid_argument("compare: shape " + shape_str(ours.shape) + " against " + shape_str(ref.shape));
  return compare(floats(ours), floats(ref), size_t(ref.shape.back()));
}

}  // namespace dsv4::test
