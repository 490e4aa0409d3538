// Summary statistics with numpy's definitions, so that numbers compare with vLLM's and SGLang's
// benchmark output: population standard deviation (np.std, ddof = 0) and percentiles by linear
// interpolation between closest ranks (np.percentile's default method).
#pragma once
#include <vector>

namespace dsv4::bench_serving {

// Each returns 0 for an empty sample (vLLM computes np.mean(values or 0)).
double mean(const std::vector<double>& values);
double stddev(const std::vector<double>& values);
double median(const std::vector<double>& values);
// p in [0, 100].
double percentile(std::vector<double> values, double p);

}  // namespace dsv4::bench_serving
