// The sweep's plot: output token throughput (left axis) and median TPOT (right axis) against
// concurrency, as a self-contained SVG 1.1 document.
#pragma once
#include <string>
#include <vector>

namespace dsv4::bench_serving {

struct SweepPoint {
  int concurrency = 1;
  double output_throughput = 0;  // tok/s
  double median_tpot_ms = 0;
};

std::string sweep_svg(const std::string& title, const std::vector<SweepPoint>& points);

// Round axis steps: the smallest 1, 2 or 5 × 10^k with at most `max_ticks` steps up to `max`.
double nice_step(double max, int max_ticks);

}  // namespace dsv4::bench_serving
