#include "bench_serving/worker_pool.h"

namespace dsv4::bench_serving {

WorkerPool::WorkerPool(BaseUrl base, HttpOptions http, size_t max_in_flight, Work work)
    : base_(std::move(base)), http_(std::move(http)), max_in_flight_(max_in_flight), work_(std::move(work)) {}

WorkerPool::~WorkerPool() {
  wait_all();
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_job_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::submit(size_t job) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_slot_.wait(lk, [&] { return max_in_flight_ == 0 || in_flight_ < max_in_flight_; });
  ++in_flight_;
  queue_.push_back(job);
  if (queue_.size() > idle_) threads_.emplace_back([this] { loop(); });
  else cv_job_.notify_one();
}

void WorkerPool::wait_all() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_slot_.wait(lk, [&] { return in_flight_ == 0; });
}

size_t WorkerPool::threads() const {
  std::lock_guard<std::mutex> lk(mu_);
  return threads_.size();
}

void WorkerPool::loop() {
  HttpClient client(base_, http_);
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    ++idle_;
    cv_job_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    --idle_;
    if (queue_.empty()) return;  // stop_
    const size_t job = queue_.front();
    queue_.pop_front();
    lk.unlock();
    work_(job, client);
    lk.lock();
    --in_flight_;
    cv_slot_.notify_all();
  }
}

}  // namespace dsv4::bench_serving
