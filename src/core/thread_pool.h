// A fixed pool of worker threads for the CPU backend's data-parallel loops.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dsv4 {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads <= 0: hardware concurrency
  ~ThreadPool();
  int size() const { return int(workers_.size()) + 1; }

  // Calls fn(begin, end) over [0, n) split into contiguous chunks, one per thread, and waits.
  // The split depends only on n and the pool size, never on timing, so results are reproducible.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

  // The pool this thread's parallel_for uses: the process's, or the one a Scope installed on it.
  static ThreadPool& global();
  static void set_global_threads(int threads);
  // While alive, parallel_for on this thread uses `pool`. A pool runs one caller's job at a time,
  // so threads that compute at once (the ranks of a tensor-parallel model) each get their own.
  class Scope {
   public:
    explicit Scope(ThreadPool& pool);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    ThreadPool* previous_;
  };

 private:
  void worker(int index);
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

// Shorthand for ThreadPool::global().parallel_for.
inline void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  ThreadPool::global().parallel_for(n, fn);
}

}  // namespace dsv4
