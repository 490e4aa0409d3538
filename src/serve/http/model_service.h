// The served model: backend, weights, tokenizer and the engine that owns them, loaded on a thread
// of its own while the server already answers (GET /health is 503 until the state is Ready).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "model/dsv4.h"
#include "runtime/engine.h"
#include "serve/tokenizer.h"

namespace dsv4::serve {

struct ServedModel {
  std::unique_ptr<Backend> backend;    // the model's, when it runs on one (null: it owns its ranks')
  std::unique_ptr<ServingModel> model;  // Dsv4Model, or TensorParallelModel
};
// Loads the weights onto a backend (the serve command passes the same loader the other model
// commands use, so the load log is the same).
using ModelLoader = std::function<ServedModel()>;

struct EngineOptions {
  int64_t max_model_len = 0;  // 0: the model's max_position_embeddings
  int max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  // Pages per layer of each cache pool; 0: enough for max_num_seqs requests of max_model_len
  // positions each, so admission is bounded by max_num_seqs alone.
  int64_t kv_cache_pages = 0;
  std::string tokenizer;  // tokenizer.json or its directory; empty: the model directory's, else the default
  std::string model_dir;
};

class ModelService {
 public:
  enum class State { Loading, Ready, Failed, Stopped };

  ModelService() = default;
  ~ModelService();
  ModelService(const ModelService&) = delete;
  ModelService& operator=(const ModelService&) = delete;

  // Loads and starts the engine; Ready on success, Failed (with error()) otherwise. Never throws.
  void load(const ModelLoader& loader, const EngineOptions& options);
  // Cancels every request and stops the engine: requests in flight finish as cancelled.
  void shutdown();

  State state() const { return state_.load(); }
  std::string error() const;

  // Valid in state Ready (and, for reading, after it).
  Engine& engine() { return *engine_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ModelConfig& config() const { return loaded_.model->config(); }
  int64_t max_model_len() const { return max_model_len_; }
  EngineStats stats() const;  // zeros before the engine exists

 private:
  std::atomic<State> state_{State::Loading};
  mutable std::mutex mutex_;  // error_
  std::string error_;
  ServedModel loaded_;
  std::optional<Tokenizer> tokenizer_;
  std::unique_ptr<Engine> engine_;
  std::atomic<Engine*> running_engine_{nullptr};  // engine_ once constructed: what other threads read
  int64_t max_model_len_ = 0;
};

// The default cache capacity per layer pool (EngineOptions::kv_cache_pages = 0): the worst case
// of max_num_seqs sequences of max_model_len positions over the model's layer kinds, plus the
// scratch of one full step.
struct CachePages {
  int64_t kv = 0, keys = 0;
};
CachePages default_cache_pages(const ServingModel& model, int64_t max_model_len, int max_num_seqs, int64_t max_num_batched_tokens);

}  // namespace dsv4::serve
