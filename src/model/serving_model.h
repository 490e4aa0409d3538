// What the engine asks of a model (runtime/engine.h, runtime/scheduler.h): one interface over the
// model on one backend (Dsv4Model) and the model split over ranks (TensorParallelModel), so the
// scheduler, the engine loop and the server drive either.
#pragma once
#include <cstdint>
#include <vector>

#include "model/kv_pool.h"
#include "model/weights.h"

namespace dsv4 {

using SeqId = int32_t;
struct BatchItem;
struct StepOutput;

class ServingModel {
 public:
  virtual ~ServingModel() = default;
  virtual const ModelConfig& config() const = 0;
  // The compression ratio of main layer `layer` (0 SWA, 4 CSA, 128 HCA).
  virtual int layer_ratio(int layer) const = 0;
  // Caps every main layer's cache pools (on every rank): pages of KV entries and of indexer keys.
  virtual void set_cache_capacity(int64_t kv_pages, int64_t key_pages) = 0;
  // Main layer `layer`'s pools (rank 0's: every rank holds the same pages), for usage reports.
  virtual const LayerCaches& layer_caches(int layer) const = 0;
  virtual SeqId new_sequence() = 0;
  virtual void free_sequence(SeqId id) = 0;
  // One step over the batch (model/dsv4.h Dsv4Model::step).
  virtual StepOutput step(const std::vector<BatchItem>& batch) = 0;
};

}  // namespace dsv4
