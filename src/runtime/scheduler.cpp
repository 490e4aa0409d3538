#include "runtime/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4 {

Scheduler::Scheduler(ServingModel& model, SchedulerConfig config) : model_(model), config_(std::move(config)) {
  const ModelConfig& c = model_.config();
  DSV4_CHECK(config_.max_num_seqs >= 1, "max_num_seqs must be ≥ 1, got {}", config_.max_num_seqs);
  // Every running sequence decodes one token per step, so the budget must hold them all.
  DSV4_CHECK(config_.max_num_batched_tokens >= config_.max_num_seqs,
             "max_num_batched_tokens ({}) must be ≥ max_num_seqs ({})", config_.max_num_batched_tokens,
             config_.max_num_seqs);
  if (config_.eos_token_ids.empty()) config_.eos_token_ids = {c.eos_token_id};
  for (int l = 0; l < c.n_layers; ++l) ratios_.push_back(model_.layer_ratio(l));
  model_.set_cache_capacity(config_.kv_pages_per_layer, config_.key_pages_per_layer);
  reserved_.assign(ratios_.size(), LayerPages{});
}

std::vector<LayerPages> Scheduler::worst_case_pages(const Sequence& seq) const {
  std::vector<LayerPages> need;
  for (int ratio : ratios_) need.push_back(sequence_layer_pages(ratio, model_.config().window, seq.max_positions()));
  return need;
}

// Capacity check against reservations, not current use: running sequences have not yet allocated
// the pages they are owed. The scratch of one full step is held back in every layer.
bool Scheduler::fits_now(const std::vector<LayerPages>& need) const {
  const int64_t scratch = step_scratch_pages(config_.max_num_batched_tokens);
  for (size_t l = 0; l < need.size(); ++l) {
    if (config_.kv_pages_per_layer > 0 && reserved_[l].kv + need[l].kv + scratch > config_.kv_pages_per_layer) return false;
    if (config_.key_pages_per_layer > 0 && reserved_[l].keys + need[l].keys > config_.key_pages_per_layer) return false;
  }
  return true;
}

void Scheduler::check_fits(const Sequence& seq) const {
  std::vector<LayerPages> need = worst_case_pages(seq);
  const int64_t scratch = step_scratch_pages(config_.max_num_batched_tokens);
  for (size_t l = 0; l < need.size(); ++l) {
    DSV4_CHECK(config_.kv_pages_per_layer == 0 || need[l].kv + scratch <= config_.kv_pages_per_layer,
               "request needs {} KV pages in layer {} (+{} step scratch) for {} positions; the cache holds {} per layer",
               need[l].kv, l, scratch, seq.max_positions(), config_.kv_pages_per_layer);
    DSV4_CHECK(config_.key_pages_per_layer == 0 || need[l].keys <= config_.key_pages_per_layer,
               "request needs {} indexer-key pages in layer {} for {} positions; the cache holds {} per layer",
               need[l].keys, l, seq.max_positions(), config_.key_pages_per_layer);
  }
}

void Scheduler::add(std::shared_ptr<Sequence> seq) {
  seq->status = SeqStatus::Waiting;
  waiting_.push_back(std::move(seq));
}

void Scheduler::admit(const std::shared_ptr<Sequence>& seq) {
  std::vector<LayerPages> need = worst_case_pages(*seq);
  for (size_t l = 0; l < need.size(); ++l) reserved_[l].kv += need[l].kv, reserved_[l].keys += need[l].keys;
  seq->slot = model_.new_sequence();
  seq->status = SeqStatus::Prefilling;
  running_.push_back(seq);
}

void Scheduler::release(Sequence& seq) {
  if (!seq.slot) return;
  model_.free_sequence(*seq.slot);
  seq.slot.reset();
  std::vector<LayerPages> need = worst_case_pages(seq);
  for (size_t l = 0; l < need.size(); ++l) reserved_[l].kv -= need[l].kv, reserved_[l].keys -= need[l].keys;
}

ScheduledStep Scheduler::schedule() {
  ScheduledStep step;
  int64_t budget = config_.max_num_batched_tokens;
  auto add_item = [&](const std::shared_ptr<Sequence>& seq, std::vector<int32_t> tokens, bool samples) {
    BatchItem item{*seq->slot, std::move(tokens)};
    item.return_logits = false;
    if (samples) {
      item.sampling = seq->request.sampling;
      item.sample_counter = uint64_t(seq->generated.size());
      item.logprobs = seq->request.logprobs;
      if (penalties_active(seq->request.penalties)) {
        item.penalties = seq->request.penalties;
        item.penalty_tokens = &seq->penalty_tokens;  // the engine thread runs the step: nothing changes it meanwhile
      }
    }
    budget -= int64_t(item.tokens.size());
    step.num_tokens += int64_t(item.tokens.size());
    step.batch.push_back(std::move(item));
    step.seqs.push_back(seq);
  };
  auto add_prefill = [&](const std::shared_ptr<Sequence>& seq) {
    const int64_t n = std::min(seq->remaining_prompt(), budget);
    if (n <= 0) return false;
    auto first = seq->request.prompt.begin() + seq->prefill_cursor;
    add_item(seq, std::vector<int32_t>(first, first + n), n == seq->remaining_prompt());
    return true;
  };
  // Decodes first: one token each, and the budget always holds them (max_num_seqs ≤ budget).
  for (auto& seq : running_)
    if (seq->status == SeqStatus::Decoding) add_item(seq, {seq->generated.back()}, true);
  for (auto& seq : running_)
    if (seq->status == SeqStatus::Prefilling && !add_prefill(seq)) break;
  // Strict FCFS admission: a head that does not fit blocks the queue, so a large request is not
  // starved by smaller ones behind it.
  while (!waiting_.empty() && budget > 0 && running_.size() < size_t(config_.max_num_seqs) &&
         fits_now(worst_case_pages(*waiting_.front()))) {
    std::shared_ptr<Sequence> seq = std::move(waiting_.front());
    waiting_.pop_front();
    admit(seq);
    add_prefill(seq);
  }
  return step;
}

void Scheduler::update(const ScheduledStep& step, const StepOutput& out) {
  for (size_t i = 0; i < step.seqs.size(); ++i) {
    Sequence& seq = *step.seqs[i];
    if (seq.status == SeqStatus::Prefilling) {
      seq.prefill_cursor += int64_t(step.batch[i].tokens.size());
      if (seq.remaining_prompt() > 0) continue;
      seq.status = SeqStatus::Decoding;
    }
    DSV4_CHECK(out.tokens[i] >= 0, "step: no token sampled for request {}", seq.id);
    std::optional<TokenLogprobs> logprobs;
    if (i < out.logprobs.size()) logprobs = out.logprobs[i];
    if (seq.append_token(out.tokens[i], config_.eos_token_ids, std::move(logprobs))) finish(seq, seq.reason);
  }
}

void Scheduler::fail(const ScheduledStep& step, const std::string& message) {
  for (auto& seq : step.seqs)
    if (!seq->finished()) finish(*seq, FinishReason::Error, message);
}

void Scheduler::finish(Sequence& seq, FinishReason reason, std::string message) {
  release(seq);
  if (!seq.finished()) seq.finish(reason, std::move(message));  // update() finishes before it retires
  auto is = [&](const std::shared_ptr<Sequence>& s) { return s.get() == &seq; };
  running_.erase(std::remove_if(running_.begin(), running_.end(), is), running_.end());
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), is), waiting_.end());
}

CacheUsage Scheduler::cache_usage() const {
  CacheUsage u;
  bool bounded = config_.kv_pages_per_layer > 0 && config_.key_pages_per_layer > 0;
  for (size_t l = 0; l < ratios_.size(); ++l) {
    const LayerCaches& lc = model_.layer_caches(int(l));
    u.pages_in_use += lc.kv.pages_in_use() + lc.keys.pages_in_use();
    if (bounded) u.capacity += lc.kv.capacity() + (ratios_[l] == 4 ? lc.keys.capacity() : 0);
  }
  return u;
}

}  // namespace dsv4
