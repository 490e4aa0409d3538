#include "serve/http/model_service.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"

namespace dsv4::serve {

namespace fs = std::filesystem;

CachePages default_cache_pages(const ServingModel& model, int64_t max_model_len, int max_num_seqs, int64_t max_num_batched_tokens) {
  const ModelConfig& c = model.config();
  CachePages most;
  for (int l = 0; l < c.n_layers; ++l) {
    LayerPages one = sequence_layer_pages(model.layer_ratio(l), c.window, max_model_len);
    most.kv = std::max(most.kv, one.kv);
    most.keys = std::max(most.keys, one.keys);
  }
  return {most.kv * max_num_seqs + step_scratch_pages(max_num_batched_tokens), std::max<int64_t>(most.keys * max_num_seqs, 1)};
}

namespace {

Tokenizer load_tokenizer(const EngineOptions& options) {
  if (!options.tokenizer.empty()) return Tokenizer::load(options.tokenizer);
  if (!options.model_dir.empty() && fs::exists(fs::path(options.model_dir) / "tokenizer.json"))
    return Tokenizer::load(options.model_dir);
  log_info("no tokenizer.json in {}: using the default DeepSeek tokenizer", options.model_dir);
  return Tokenizer::load_default();
}

}  // namespace

ModelService::~ModelService() { shutdown(); }

void ModelService::load(const ModelLoader& loader, const EngineOptions& options) {
  try {
    tokenizer_.emplace(load_tokenizer(options));
    loaded_ = loader();
    const ModelConfig& c = loaded_.model->config();
    max_model_len_ = options.max_model_len > 0 ? options.max_model_len : c.max_position_embeddings;
    DSV4_CHECK(max_model_len_ <= c.max_position_embeddings, "--max-model-len {} exceeds the model's max_position_embeddings {}",
               max_model_len_, c.max_position_embeddings);
    EngineConfig config;
    config.scheduler.max_num_seqs = options.max_num_seqs;
    config.scheduler.max_num_batched_tokens = options.max_num_batched_tokens;
    CachePages pages = default_cache_pages(*loaded_.model, max_model_len_, options.max_num_seqs, options.max_num_batched_tokens);
    if (options.kv_cache_pages > 0) pages = {options.kv_cache_pages, options.kv_cache_pages};
    config.scheduler.kv_pages_per_layer = pages.kv;
    config.scheduler.key_pages_per_layer = pages.keys;
    engine_ = std::make_unique<Engine>(*loaded_.model, std::move(config));
    running_engine_.store(engine_.get());
    log_info("engine: max_model_len {}, max_num_seqs {}, max_num_batched_tokens {}, cache pages per layer {} KV + {} keys",
             max_model_len_, options.max_num_seqs, options.max_num_batched_tokens, pages.kv, pages.keys);
    State expected = State::Loading;
    if (!state_.compare_exchange_strong(expected, State::Ready)) engine_->shutdown();  // shut down while loading
  } catch (const std::exception& e) {
    {
      std::lock_guard lock(mutex_);
      error_ = e.what();
    }
    State expected = State::Loading;
    state_.compare_exchange_strong(expected, State::Failed);
  }
}

void ModelService::shutdown() {
  State previous = state_.exchange(State::Stopped);
  if (previous == State::Ready && engine_) engine_->shutdown(Engine::Shutdown::Cancel);
}

std::string ModelService::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

EngineStats ModelService::stats() const {
  const State s = state();
  Engine* engine = running_engine_.load();
  return (s == State::Ready || s == State::Stopped) && engine != nullptr ? engine->stats() : EngineStats{};
}

}  // namespace dsv4::serve
