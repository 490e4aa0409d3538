#include "core/log.h"

#include <unistd.h>

#include <chrono>

namespace dsv4 {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

Progress::Progress(const char* what)
    : what_(what), active_(log_level() >= LogLevel::Info && ::isatty(2)), start_(now_s()) {}

void Progress::update(int64_t done, int64_t total, double bytes) {
  if (!active_) return;
  const double secs = std::max(now_s() - start_, 1e-9);
  const int width = 30, filled = total > 0 ? int(double(width) * double(done) / double(total)) : width;
  fmt::print(stderr, "\r  {} [{:<{}}] {}/{}  {:.2f} GB  {:.2f} GB/s ", what_, std::string(size_t(filled), '#'), width, done,
             total, bytes / 1e9, bytes / 1e9 / secs);
  std::fflush(stderr);
}

void Progress::done() {
  if (active_) fmt::print(stderr, "\n");
  active_ = false;
}

}  // namespace dsv4
