// A request-count progress bar redrawn on stderr a few times a second, only when stderr is a
// terminal (a run under nohup writes clean logs).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace dsv4::bench_serving {

class ProgressBar {
 public:
  ProgressBar(std::string what, int64_t total, bool enabled);
  ~ProgressBar();  // finish()
  void add(int64_t n = 1) { done_ += n; }
  void finish();

 private:
  void draw();
  const std::string what_;
  const int64_t total_;
  const double start_;
  std::atomic<int64_t> done_{0};
  bool active_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dsv4::bench_serving
