// The engine loop (DESIGN §3.10): one thread owns the model and the scheduler and runs one step at
// a time; callers submit requests and read each request's events from its own thread-safe stream.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <atomic>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "runtime/scheduler.h"

namespace dsv4 {

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

struct Event {
  enum class Kind { Token, Finished } kind = Kind::Token;
  int32_t token = -1;                         // Token: the sampled id
  // Token: this is the EOS / stop token that finishes the request. Set on the token itself (not
  // only on the Finished event after it) so a streaming reader can leave its text out of the
  // output without waiting for the next event.
  bool is_stop_token = false;
  std::optional<TokenLogprobs> logprobs;      // Token, when the request asked for logprobs
  FinishReason reason = FinishReason::None;   // Finished: why
  std::string error;                          // Finished with FinishReason::Error
  int32_t stop_token = -1;                    // Finished by EOS / a stop token: that id (also the last Token)
  Usage usage;                                // Finished
};

// One request's events, in order: a Token per sampled token, then exactly one Finished.
class RequestStream {
 public:
  explicit RequestStream(uint64_t id) : id_(id) {}
  uint64_t id() const { return id_; }
  // The next event, waiting up to `timeout`; nullopt when none came (or all were read).
  std::optional<Event> next(std::chrono::milliseconds timeout);
  bool finished() const;  // the Finished event has been pushed (maybe not read yet)

  void push(Event e);  // engine side

 private:
  const uint64_t id_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Event> events_;
  bool finished_ = false;
};
using RequestHandle = std::shared_ptr<RequestStream>;

// The composition of one step, for tests and tracing.
struct StepRecord {
  struct Part {
    uint64_t request = 0;
    int64_t tokens = 0;
    bool prefill = false;
  };
  std::vector<Part> parts;
  int64_t num_tokens = 0;
};

struct EngineStats {
  size_t running = 0, waiting = 0;
  int64_t cache_pages_in_use = 0, cache_pages_capacity = 0;  // capacity 0: unbounded
  uint64_t prompt_tokens = 0;      // prompt tokens run through the model
  uint64_t generation_tokens = 0;  // tokens sampled
  uint64_t steps = 0, requests_finished = 0, requests_failed = 0;
};

struct EngineConfig {
  SchedulerConfig scheduler;
  // Called on the engine thread after every successful step (keep it short).
  std::function<void(const StepRecord&)> on_step;
};

class Engine {
 public:
  // The engine uses `model` from its own thread until shutdown: nobody else may touch it meanwhile.
  Engine(ServingModel& model, EngineConfig config);
  ~Engine();  // shutdown(Shutdown::Cancel)
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues; throws Error for a request that is invalid or can never fit the cache,
  // or after shutdown.
  RequestHandle submit(Request request);
  // Finish a request with "cancelled" / "stop" (the caller matched a stop string); its pages are
  // freed before the next step. No-ops for finished requests.
  void cancel(const RequestHandle& h) { command(h, FinishReason::Cancelled); }
  void stop(const RequestHandle& h) { command(h, FinishReason::Stop); }

  enum class Shutdown { Cancel, Drain };  // cancel everything / finish what was submitted
  void shutdown(Shutdown mode = Shutdown::Cancel);  // joins the loop; idempotent

  EngineStats stats() const;

 private:
  struct Entry {
    std::shared_ptr<Sequence> seq;
    RequestHandle stream;
    size_t emitted = 0;  // generated tokens already pushed
  };
  void command(const RequestHandle& h, FinishReason reason);
  void loop();
  bool run_step();  // false when nothing could be scheduled
  void publish(const std::shared_ptr<Entry>& e);  // new tokens and, once finished, the final event
  void finish_all(FinishReason reason, const std::string& message);
  void refresh_stats();

  ServingModel& model_;
  EngineConfig config_;
  Scheduler scheduler_;  // engine thread only

  mutable std::mutex mutex_;  // guards everything below up to the thread
  std::condition_variable wake_;
  std::vector<std::shared_ptr<Entry>> inbox_;
  std::vector<std::pair<uint64_t, FinishReason>> commands_;
  bool stopping_ = false;
  Shutdown shutdown_mode_ = Shutdown::Cancel;
  EngineStats stats_;

  std::atomic<uint64_t> next_id_{1};
  std::unordered_map<uint64_t, std::shared_ptr<Entry>> entries_;  // engine thread only
  std::mutex join_mutex_;
  std::thread thread_;
};

}  // namespace dsv4
