#include "model/tensor_parallel_model.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/log.h"

namespace dsv4 {

namespace {
// The GPU of each rank: rank r on GPU r, or DSV4_RANK_GPUS=0,0,… (ranks may share one: tests).
std::vector<int> rank_gpus(int world) {
  std::vector<int> gpus;
  const char* env = std::getenv("DSV4_RANK_GPUS");
  if (!env || !*env) {
    for (int r = 0; r < world; ++r) gpus.push_back(r);
    return gpus;
  }
  std::stringstream in(env);
  for (std::string item; std::getline(in, item, ',');) {
    char* end = nullptr;
    const long g = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end || g < 0 || g > 1023) fail("DSV4_RANK_GPUS={}: expected GPU indices, one per rank (0,1,…)", env);
    gpus.push_back(int(g));
  }
  if (int(gpus.size()) != world) fail("DSV4_RANK_GPUS={}: {} GPUs for {} ranks", env, gpus.size(), world);
  return gpus;
}
}  // namespace

TensorParallelModel::TensorParallelModel(const std::string& dir, const std::string& backend_name, Options options,
                                         const BackendWrapper& wrap)
    : options_(options) {
  DSV4_CHECK(options.world >= 1, "tensor-parallel size {} (at least 1)", options.world);
  for (int r = 0; r < options.world; ++r) ranks_.push_back(std::make_unique<Rank>());
  auto make_rank_backend = [&](int r, int gpu) {
    std::unique_ptr<Backend> b = make_backend(backend_name, gpu);
    ranks_[size_t(r)]->device = b.get();
    ranks_[size_t(r)]->backend = wrap ? wrap(r, std::move(b)) : std::move(b);
  };
  if (options.world == 1) {
    make_rank_backend(0, 0);
    ranks_[0]->model = std::make_unique<Dsv4Model>(load_model_weights(dir, ranks_[0]->backend.get()), *ranks_[0]->backend);
    return;
  }
  // The process's CPU workers, divided among the ranks (a pool serves one caller at a time).
  const int workers = std::max(1, ThreadPool::global().size() / options.world);
  for (int r = 0; r < options.world; ++r) {
    ranks_[size_t(r)]->pool = std::make_unique<ThreadPool>(workers);
    ranks_[size_t(r)]->thread = std::thread([this, r] { rank_loop(r); });
  }
  try {
    // Each rank's backend on its own thread (a GPU backend makes its device that thread's), then
    // the group over them, then the models.
    const std::vector<int> gpus = rank_gpus(options.world);
    on_every_rank([&](int r) { make_rank_backend(r, gpus[size_t(r)]); });
    std::vector<Backend*> backends;
    for (auto& rank : ranks_) backends.push_back(rank->device);
    group_ = make_communicator_group(backends);
    on_every_rank([&](int r) {
      Rank& rank = *ranks_[size_t(r)];
      const ParallelLayout layout{r, options.world, options.expert_parallel};
      rank.model = std::make_unique<Dsv4Model>(load_model_weights(dir, rank.backend.get(), layout), *rank.backend,
                                               group_.ranks[size_t(r)].get());
    });
  } catch (...) {
    stop_rank_threads();  // a thread still joinable would end the process
    throw;
  }
}

TensorParallelModel::~TensorParallelModel() {
  // Each rank's model goes on its own thread (a GPU rank's memory, recordings and events belong to
  // the device that thread has current), then the communicators, then the backends (a communicator
  // enqueues on its rank's backend; a backend makes its own device current to go).
  if (options_.world > 1) {
    try {
      on_every_rank([&](int r) { ranks_[size_t(r)]->model.reset(); });
    } catch (const std::exception& e) {
      log_info("tensor-parallel ranks: releasing a rank's model failed: {}", e.what());
    }
  }
  stop_rank_threads();
  for (auto& r : ranks_) r->model.reset();  // world 1, or a rank whose release failed above
  group_ = {};
  for (auto& r : ranks_) r->backend.reset();
}

void TensorParallelModel::stop_rank_threads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  job_ready_.notify_all();
  for (auto& r : ranks_)
    if (r->thread.joinable()) r->thread.join();
}

void TensorParallelModel::rank_loop(int r) {
  Rank& rank = *ranks_[size_t(r)];
  ThreadPool::Scope scope(*rank.pool);
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      job_ready_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    try {
      (*job)(r);
    } catch (...) {
      rank.error = std::current_exception();
      if (group_.abort) group_.abort();  // the other ranks may wait for this one in a collective
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (--running_ == 0) job_done_.notify_all();
  }
}

void TensorParallelModel::on_every_rank(const std::function<void(int)>& fn) {
  if (options_.world == 1) {
    fn(0);
    return;
  }
  {
    std::unique_lock<std::mutex> lock(mutex_);
    for (auto& r : ranks_) r->error = nullptr;
    job_ = &fn;
    running_ = options_.world;
    ++generation_;
  }
  job_ready_.notify_all();
  {
    std::unique_lock<std::mutex> lock(mutex_);
    job_done_.wait(lock, [&] { return running_ == 0; });
    job_ = nullptr;
  }
  // The failure that caused the others: a rank's own error before an abandoned collective.
  std::exception_ptr first, abandoned;
  for (auto& r : ranks_) {
    if (!r->error) continue;
    try {
      std::rethrow_exception(r->error);
    } catch (const CollectiveAborted&) {
      if (!abandoned) abandoned = r->error;
    } catch (...) {
      if (!first) first = r->error;
    }
  }
  if (first || abandoned) {
    if (group_.reset) {
      try {
        group_.reset();
        // A reset group may have new communicators (NCCL's are rebuilt): recordings that captured
        // the old ones' collectives must not replay.
        on_every_rank([&](int r) {
          if (ranks_[size_t(r)]->model) ranks_[size_t(r)]->model->drop_recordings();
        });
      } catch (const std::exception& e) {
        // The caller hears of the failure that started it; later calls find the group aborted.
        log_info("tensor-parallel ranks: the collectives could not be reset: {}", e.what());
      }
    }
    std::rethrow_exception(first ? first : abandoned);
  }
}

SeqId TensorParallelModel::new_sequence() {
  std::vector<SeqId> ids(size_t(options_.world));
  on_every_rank([&](int r) { ids[size_t(r)] = ranks_[size_t(r)]->model->new_sequence(); });
  for (SeqId id : ids) DSV4_CHECK(id == ids[0], "tensor-parallel ranks disagree on a new sequence's id ({} vs {})", id, ids[0]);
  return ids[0];
}

void TensorParallelModel::set_cache_capacity(int64_t kv_pages, int64_t key_pages) {
  on_every_rank([&](int r) { ranks_[size_t(r)]->model->set_cache_capacity(kv_pages, key_pages); });
}

void TensorParallelModel::free_sequence(SeqId id) {
  on_every_rank([&](int r) { ranks_[size_t(r)]->model->free_sequence(id); });
}

StepOutput TensorParallelModel::step(const std::vector<BatchItem>& batch) {
  StepOutput out;
  on_every_rank([&](int r) {
    StepOutput o = ranks_[size_t(r)]->model->step(batch);
    if (r == 0) out = std::move(o);
  });
  return out;
}

}  // namespace dsv4
