// Forms every step (DESIGN §3.10): the running sequences' decode tokens, then prefill chunks of
// admitted sequences, then newly admitted ones, under a token budget and a sequence limit,
// first come first served.
//
// Admission reserves a sequence's worst case: the pages its whole prompt + max_tokens can need in
// every layer (sequence_layer_pages), plus, once per layer, the scratch pages of a full step. A
// sequence is admitted only when that fits every capacity-limited pool. So a running sequence can
// always grow and is never preempted: the policy "when a running sequence cannot grow" is that it
// cannot happen. Should a pool still run out (a bug), the step throws and the engine finishes that
// step's requests with an error; nothing is retried, because a failed step may have left their
// cache state half-written. Reserving the worst case wastes capacity on requests that stop early;
// preemption with recompute would recover it, at the cost of repeated prefill.
#pragma once
#include <deque>
#include <memory>
#include <vector>

#include "model/dsv4.h"
#include "runtime/sequence.h"

namespace dsv4 {

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 2048;  // tokens per step, decode tokens included
  int max_num_seqs = 64;                  // sequences holding a model sequence at once
  int64_t kv_pages_per_layer = 0;         // capacity of each layer's KV pool; 0 = unbounded
  int64_t key_pages_per_layer = 0;        // capacity of each CSA layer's indexer-key pool; 0 = unbounded
  std::vector<int32_t> eos_token_ids;     // empty: the model config's eos_token_id
};

struct ScheduledStep {
  std::vector<std::shared_ptr<Sequence>> seqs;  // seqs[i] runs batch[i]
  std::vector<BatchItem> batch;
  int64_t num_tokens = 0;
  bool empty() const { return batch.empty(); }
};

struct CacheUsage {
  int64_t pages_in_use = 0;  // all main layers, both pools
  int64_t capacity = 0;      // 0 when any pool is unbounded
};

class Scheduler {
 public:
  // Applies the page capacities to the model's pools.
  Scheduler(ServingModel& model, SchedulerConfig config);

  // Throws Error when the request can never run here (its worst case exceeds an empty cache).
  void check_fits(const Sequence& seq) const;
  void add(std::shared_ptr<Sequence> seq);  // to the back of the waiting queue
  ScheduledStep schedule();
  // Applies a finished step's sampled tokens; sequences that finished give their pages back.
  void update(const ScheduledStep& step, const StepOutput& out);
  // The step threw: its sequences finish with `message`.
  void fail(const ScheduledStep& step, const std::string& message);
  // Cancel or caller stop: finishes `seq` wherever it is (keeping an earlier reason) and frees its
  // pages at once.
  void finish(Sequence& seq, FinishReason reason, std::string message = {});

  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  const std::deque<std::shared_ptr<Sequence>>& waiting() const { return waiting_; }
  const std::vector<std::shared_ptr<Sequence>>& running() const { return running_; }
  CacheUsage cache_usage() const;
  const SchedulerConfig& config() const { return config_; }
  // Worst-case pages of `seq` per main layer (what admission reserves).
  std::vector<LayerPages> worst_case_pages(const Sequence& seq) const;

 private:
  bool fits_now(const std::vector<LayerPages>& need) const;
  void admit(const std::shared_ptr<Sequence>& seq);
  void release(Sequence& seq);  // frees the model sequence and the reservation

  ServingModel& model_;
  SchedulerConfig config_;
  std::vector<int> ratios_;                   // per main layer
  std::deque<std::shared_ptr<Sequence>> waiting_;
  std::vector<std::shared_ptr<Sequence>> running_;  // admitted, in admission order
  std::vector<LayerPages> reserved_;          // per main layer, over running_
};

}  // namespace dsv4
