#include "bench_serving/stats.h"

#include <algorithm>
#include <cmath>

namespace dsv4::bench_serving {

double mean(const std::vector<double>& values) {
  if (values.empty()) return 0;
  double sum = 0;
  for (double v : values) sum += v;
  return sum / double(values.size());
}

double stddev(const std::vector<double>& values) {
  if (values.empty()) return 0;
  const double m = mean(values);
  double sq = 0;
  for (double v : values) sq += (v - m) * (v - m);
  return std::sqrt(sq / double(values.size()));
}

double median(const std::vector<double>& values) { return percentile(values, 50); }

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  // numpy "linear": the value at fractional rank (n - 1) * p / 100.
  const double rank = double(values.size() - 1) * std::clamp(p, 0.0, 100.0) / 100.0;
  const size_t lo = size_t(std::floor(rank)), hi = std::min(lo + 1, values.size() - 1);
  const double frac = rank - double(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

}  // namespace dsv4::bench_serving
