#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

namespace dsv4::test {

namespace fs = std::filesystem;

CommandResult run_dsv4(const std::string& args) {
  static int counter = 0;
  const std::string log = (fs::path(DSV4_TEST_TMP) / ("command." + std::to_string(::getpid()) + "." +
                                                      std::to_string(counter++) + ".log")).string();
  fs::create_directories(DSV4_TEST_TMP);
  int rc = std::system((std::string(DSV4_BINARY) + " " + args + " >" + log + " 2>&1").c_str());
  CommandResult r{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_text(log)};
  fs::remove(log);
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
  fs::path p = fs::path(DSV4_TEST_TMP) / name;
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

}  // namespace dsv4::test
