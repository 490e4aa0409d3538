#include "runtime/engine.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/heap.h"
#include "core/log.h"

namespace dsv4 {

std::optional<Event> RequestStream::next(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  Event e = std::move(events_.front());
  events_.pop_front();
  return e;
}

bool RequestStream::finished() const {
  std::lock_guard lock(mutex_);
  return finished_;
}

void RequestStream::push(Event e) {
  {
    std::lock_guard lock(mutex_);
    if (finished_) return;  // exactly one Finished, nothing after it
    finished_ = e.kind == Event::Kind::Finished;
    events_.push_back(std::move(e));
  }
  ready_.notify_all();
}

Engine::Engine(ServingModel& model, EngineConfig config)
    : model_(model), config_(std::move(config)), scheduler_(model_, config_.scheduler) {
  refresh_stats();
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(Shutdown::Cancel); }

RequestHandle Engine::submit(Request request) {
  validate_request(request, model_.config());
  auto entry = std::make_shared<Entry>();
  const uint64_t id = next_id_++;
  entry->seq = std::make_shared<Sequence>(id, std::move(request));
  scheduler_.check_fits(*entry->seq);  // reads only what is fixed at construction
  entry->stream = std::make_shared<RequestStream>(id);
  {
    std::lock_guard lock(mutex_);
    DSV4_CHECK(!stopping_, "the engine is shutting down");
    inbox_.push_back(entry);
    ++stats_.waiting;  // visible at once; the loop refreshes it
  }
  wake_.notify_one();
  return entry->stream;
}

void Engine::command(const RequestHandle& h, FinishReason reason) {
  if (!h) return;
  {
    std::lock_guard lock(mutex_);
    commands_.emplace_back(h->id(), reason);
  }
  wake_.notify_one();
}

void Engine::shutdown(Shutdown mode) {
  std::lock_guard join(join_mutex_);
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) shutdown_mode_ = mode;
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void Engine::loop() {
  bool stalled = false;  // work exists but nothing could be scheduled: wait for new input
  bool was_busy = false;
  for (;;) {
    std::vector<std::shared_ptr<Entry>> inbox;
    std::vector<std::pair<uint64_t, FinishReason>> commands;
    bool stopping;
    Shutdown mode;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] {
        return stopping_ || !inbox_.empty() || !commands_.empty() || (scheduler_.has_work() && !stalled);
      });
      inbox.swap(inbox_);
      commands.swap(commands_);
      stopping = stopping_;
      mode = shutdown_mode_;
    }
    // Nothing in here may end the loop: an escaping exception would terminate the process.
    try {
      for (auto& e : inbox) {
        entries_[e->seq->id] = e;
        scheduler_.add(e->seq);
      }
      for (auto& [id, reason] : commands) {
        auto it = entries_.find(id);
        if (it == entries_.end()) continue;  // finished already
        std::shared_ptr<Entry> e = it->second;
        scheduler_.finish(*e->seq, reason);  // frees its pages now, before any further step
        publish(e);
      }
      // New arrivals and cancellations show in stats() now, not only after the next step (which
      // may take a while): a cancelled request's freed pages are visible at once.
      if (!inbox.empty() || !commands.empty()) refresh_stats();
      if (stopping && (mode == Shutdown::Cancel || stalled)) {
        finish_all(FinishReason::Cancelled, {});
        refresh_stats();
        return;
      }
      stalled = scheduler_.has_work() && !run_step();
    } catch (const std::exception& ex) {
      // Not a step failure (run_step handles those): bookkeeping broke, so no request is safe.
      finish_all(FinishReason::Error, fmt::format("engine error: {}", ex.what()));
      stalled = false;
    }
    refresh_stats();
    if (stopping && !scheduler_.has_work()) return;
    // Gone idle: what the last burst of work allocated goes back to the system (core/heap.h).
    const bool busy = scheduler_.has_work();
    if (was_busy && !busy) {
      const int64_t released = release_free_heap();
      if (released > 0) log_debug("engine idle: {:.1f} MiB of free heap returned to the system", double(released) / (1 << 20));
    }
    was_busy = busy;
  }
}

bool Engine::run_step() {
  ScheduledStep step = scheduler_.schedule();
  if (step.empty()) return false;
  StepRecord record;
  record.num_tokens = step.num_tokens;
  uint64_t prompt_tokens = 0, sampled = 0;
  for (size_t i = 0; i < step.seqs.size(); ++i) {
    const bool prefill = step.seqs[i]->status == SeqStatus::Prefilling;
    record.parts.push_back({step.seqs[i]->id, int64_t(step.batch[i].tokens.size()), prefill});
    if (prefill) prompt_tokens += step.batch[i].tokens.size();
    if (step.batch[i].sampling) ++sampled;
  }
  bool ok = true;
  try {
    StepOutput out = model_.step(step.batch);
    scheduler_.update(step, out);
  } catch (const std::exception& ex) {
    // The step may have written part of its sequences' cache state: they cannot continue.
    scheduler_.fail(step, fmt::format("step failed: {}", ex.what()));
    ok = false;
  }
  {
    std::lock_guard lock(mutex_);
    ++stats_.steps;
    if (ok) stats_.prompt_tokens += prompt_tokens, stats_.generation_tokens += sampled;
  }
  // Stats first, then the step's events: a client that has seen a token sees the cache and the
  // counters of the step that produced it (metrics read right after a token are not stale).
  refresh_stats();
  for (auto& seq : step.seqs)
    if (auto it = entries_.find(seq->id); it != entries_.end()) publish(it->second);
  if (ok && config_.on_step) config_.on_step(record);
  return true;
}

void Engine::publish(const std::shared_ptr<Entry>& e) {
  const Sequence& seq = *e->seq;
  for (; e->emitted < seq.generated.size(); ++e->emitted) {
    Event ev;
    ev.token = seq.generated[e->emitted];
    ev.is_stop_token = seq.finished() && seq.stop_token >= 0 && e->emitted + 1 == seq.generated.size();
    if (e->emitted < seq.generated_logprobs.size()) ev.logprobs = std::move(e->seq->generated_logprobs[e->emitted]);
    e->stream->push(std::move(ev));
  }
  if (!seq.finished()) return;
  Event fin;
  fin.kind = Event::Kind::Finished;
  fin.reason = seq.reason;
  fin.error = seq.error;
  fin.stop_token = seq.stop_token;
  fin.usage = {seq.prompt_len(), int64_t(seq.generated.size())};
  {  // counted before the event goes out, for the same reason as refresh_stats() before publish()
    std::lock_guard lock(mutex_);
    ++stats_.requests_finished;
    if (seq.reason == FinishReason::Error) ++stats_.requests_failed;
  }
  e->stream->push(std::move(fin));
  entries_.erase(seq.id);
}

void Engine::finish_all(FinishReason reason, const std::string& message) {
  std::vector<std::shared_ptr<Entry>> all;
  for (auto& [id, e] : entries_) all.push_back(e);
  for (auto& e : all) {
    try {
      scheduler_.finish(*e->seq, reason, message);
    } catch (const std::exception& ex) {
      e->seq->finish(FinishReason::Error, ex.what());
    }
    publish(e);
  }
}

void Engine::refresh_stats() {
  CacheUsage cache = scheduler_.cache_usage();
  std::lock_guard lock(mutex_);
  stats_.running = scheduler_.num_running();
  stats_.waiting = scheduler_.num_waiting() + inbox_.size();
  stats_.cache_pages_in_use = cache.pages_in_use;
  stats_.cache_pages_capacity = cache.capacity;
}

}  // namespace dsv4
