#include "bench_serving/progress_bar.h"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "bench_serving/request.h"

namespace dsv4::bench_serving {

ProgressBar::ProgressBar(std::string what, int64_t total, bool enabled)
    : what_(std::move(what)), total_(total), start_(steady_seconds()), active_(enabled && ::isatty(2)) {
  if (!active_) return;
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lk(mu_);
    while (!cv_.wait_for(lk, std::chrono::milliseconds(250), [&] { return stop_; })) draw();
  });
}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::draw() {
  const int64_t done = std::min<int64_t>(done_.load(), total_);
  const double elapsed = steady_seconds() - start_;
  const int width = 30, filled = total_ > 0 ? int(width * done / total_) : width;
  const double rate = elapsed > 0 ? double(done) / elapsed : 0;
  fmt::print(stderr, "\r{} {:3d}%|{:<{}}| {}/{} [{:.1f}s, {:.2f} req/s] ", what_, total_ > 0 ? 100 * done / total_ : 100,
             std::string(size_t(filled), '#'), width, done, total_, elapsed, rate);
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (!active_) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  draw();
  fmt::print(stderr, "\n");
  active_ = false;
}

}  // namespace dsv4::bench_serving
