// The benchmark's threads: one per request in flight, each with its own keep-alive connection,
// created when a request finds no idle thread (so a run with concurrency C holds C threads and C
// connections, like aiohttp's pool). A blocking read per stream costs the client a wake-up per
// chunk and nothing while a stream is silent, which keeps it far from being the bottleneck at
// hundreds of streams (tests/bench measures it).
#pragma once
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "bench_serving/http_client.h"

namespace dsv4::bench_serving {

class WorkerPool {
 public:
  using Work = std::function<void(size_t job, HttpClient& client)>;
  // max_in_flight 0: unbounded.
  WorkerPool(BaseUrl base, HttpOptions http, size_t max_in_flight, Work work);
  ~WorkerPool();  // waits for the submitted jobs, then joins the threads

  // Blocks while max_in_flight jobs are running or queued, then hands `job` to a thread.
  void submit(size_t job);
  // Blocks until every submitted job has finished.
  void wait_all();
  size_t threads() const;

 private:
  void loop();
  const BaseUrl base_;
  const HttpOptions http_;
  const size_t max_in_flight_;
  const Work work_;
  mutable std::mutex mu_;
  std::condition_variable cv_job_, cv_slot_;
  std::deque<size_t> queue_;
  size_t idle_ = 0, in_flight_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace dsv4::bench_serving
