// One model run on several ranks at once (docs/ARCHITECTURE.md "Tensor parallelism"): each rank is
// a thread with its own backend, its share of the weights (model/parallel_layout.h) and its own
// Dsv4Model, the ranks summing partial outputs through a communicator. step() takes the batch
// Dsv4Model::step takes and returns rank 0's output, so a command or the engine (ServingModel)
// drives it as one model.
//
// Every rank runs the host side of each step itself (validation, pages, the descriptor): given the
// same calls in the same order the ranks' sequences and pages stay identical, so only the
// collectives cross between them. Ranks in other processes would have rank 0 broadcast each step's
// batch first (Communicator::broadcast).
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/communicator.h"
#include "core/thread_pool.h"
#include "model/dsv4.h"

namespace dsv4 {

class TensorParallelModel : public ServingModel {
 public:
  struct Options {
    int world = 1;                 // --tensor-parallel-size
    bool expert_parallel = false;  // --expert-parallel: routed experts by expert, not by intermediate
  };
  // What each rank's models runs on, given the rank and its new backend (a profiling backend
  // around it, say); the collectives use the backend given.
  using BackendWrapper = std::function<std::unique_ptr<Backend>(int rank, std::unique_ptr<Backend>)>;
  // Loads `dir` for every rank, each on a new backend named `backend_name` and on its own thread
  // (each rank binds only its share). The CPU workers are divided among the ranks. world = 1 is
  // the plain model, run on the caller's thread.
  TensorParallelModel(const std::string& dir, const std::string& backend_name, Options options,
                      const BackendWrapper& wrap = {});
  ~TensorParallelModel() override;

  int world_size() const { return options_.world; }
  bool expert_parallel() const { return options_.expert_parallel; }
  const ModelConfig& config() const override { return ranks_[0]->model->config(); }
  int layer_ratio(int layer) const override { return ranks_[0]->model->layer_ratio(layer); }
  void set_cache_capacity(int64_t kv_pages, int64_t key_pages) override;  // every rank's
  const LayerCaches& layer_caches(int layer) const override { return ranks_[0]->model->layer_caches(layer); }
  Dsv4Model& rank_model(int rank) { return *ranks_.at(size_t(rank))->model; }
  Backend& rank_backend(int rank) { return *ranks_.at(size_t(rank))->backend; }

  SeqId new_sequence() override;
  void free_sequence(SeqId id) override;
  int64_t position(SeqId id) const { return ranks_[0]->model->position(id); }
  // One step on every rank; rank 0's output.
  StepOutput step(const std::vector<BatchItem>& batch) override;

  // Runs fn(rank) on every rank's thread at once and waits for all of them. A rank that throws
  // aborts the collectives the others wait in; the first failure (not an abandoned collective) is
  // rethrown here, and the group is ready for the next call.
  void on_every_rank(const std::function<void(int rank)>& fn);

 private:
  struct Rank {
    std::unique_ptr<Backend> backend;  // the model's (wrapped, where a wrapper was given)
    Backend* device = nullptr;         // the backend made for the rank, which the collectives use
    std::unique_ptr<Dsv4Model> model;
    std::unique_ptr<ThreadPool> pool;  // this rank's CPU workers
    std::thread thread;
    std::exception_ptr error;
  };
  void rank_loop(int rank);
  void stop_rank_threads();

  Options options_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  // After the ranks: a constructor that fails part way destroys the communicators first, then the
  // backends they enqueue on (the destructor keeps that order by hand too).
  CommunicatorGroup group_;
  // The job every rank thread runs once per generation.
  std::mutex mutex_;
  std::condition_variable job_ready_, job_done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int running_ = 0;
  bool stop_ = false;
};

}  // namespace dsv4
