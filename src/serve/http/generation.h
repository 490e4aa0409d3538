// What the generating endpoints share: the server context handlers see, one engine request per
// choice with its text pipeline and metrics (ChoiceRun), JSON and error responses, and the SSE
// response that pumps a stream source from cpp-httplib's chunked content provider.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "serve/http/choice_text.h"
#include "serve/http/client_connection.h"
#include "serve/http/metrics.h"
#include "serve/http/model_service.h"
#include "serve/openai_request.h"
#include "serve/openai_response.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace dsv4::serve {

using Clock = std::chrono::steady_clock;

struct ServerContext {
  ServerContext(ModelService& service, ServerMetrics& metrics, std::string model_name, std::string model_root, int64_t created)
      : service(service), metrics(metrics), model_name(std::move(model_name)), model_root(std::move(model_root)), created(created) {}

  ModelService& service;
  ServerMetrics& metrics;
  std::string model_name;  // served model name
  std::string model_root;  // the checkpoint directory
  int64_t created = 0;     // Unix seconds the server started (model cards)

  // A fresh random number for response ids and unseeded sampling (thread-safe).
  uint64_t nonce();
  // 503 unless the model is loaded; true when it is ready.
  bool require_ready(httplib::Response& res);
  openai::RequestLimits limits() const;
  // 404 when the request names another model (an empty name means the served one).
  bool check_model(const std::string& requested, httplib::Response& res) const;

 private:
  std::mutex nonce_mutex_;
  std::mt19937_64 rng_{std::random_device{}()};
};

void send_json(httplib::Response& res, const nlohmann::ordered_json& body, int status = 200);
void send_error(httplib::Response& res, const openai::ApiError& error);

// One choice: an engine request, its text, its finish, its metrics. The engine request is
// cancelled when the run is destroyed unfinished, whatever path the handler leaves by.
class ChoiceRun {
 public:
  // Submits the request; on failure (invalid for the engine, cannot fit the cache, shutting
  // down) error() is set and done() is true.
  ChoiceRun(ServerContext& context, std::vector<int32_t> prompt, const openai::GenerationParams& params, Clock::time_point arrival);
  ~ChoiceRun();
  ChoiceRun(const ChoiceRun&) = delete;
  ChoiceRun& operator=(const ChoiceRun&) = delete;

  // Text to send and, when asked for, the logprobs of the tokens it came from.
  using OnText = std::function<void(std::string_view text, std::vector<openai::TokenLogprob> logprobs)>;
  // Handles the events that arrive within `wait`: the first one waits, the rest are taken as they
  // are. Returns whether any came.
  bool poll(std::chrono::milliseconds wait, const OnText& on_text);
  // The client went away: cancels the engine request (its pages are freed before the next step).
  void abandon();

  bool done() const { return done_; }
  const std::optional<openai::ApiError>& error() const { return error_; }
  openai::FinishReason finish_reason() const { return reason_; }
  openai::Usage usage() const { return usage_; }
  const std::string& text() const { return text_.text(); }
  // Every sent token's logprobs so far (requests that asked for logprobs).
  const std::vector<openai::TokenLogprob>& logprobs() const { return logprobs_; }

 private:
  void handle_finished(const Event& event, const OnText& on_text);
  void record_finished(FinishedReason reason);

  ServerContext& context_;
  Clock::time_point arrival_, last_token_;
  RequestHandle handle_;
  ChoiceText text_;
  bool done_ = false;
  bool first_token_seen_ = false;
  std::optional<openai::ApiError> error_;
  openai::FinishReason reason_ = openai::FinishReason::Stop;
  openai::Usage usage_;
  std::vector<openai::TokenLogprob> logprobs_;
};

// Streaming responses: a source produces the SSE bytes of a response piece by piece.
class SseSource {
 public:
  virtual ~SseSource() = default;
  // Bytes to write now (may be empty); `finished` once the stream is complete ([DONE] included).
  virtual std::string next(std::chrono::milliseconds wait, bool& finished) = 0;
  // The client went away or the write failed: cancel what is still running.
  virtual void abandon() = 0;
};

// Answers `req` with a text/event-stream response pumped from `source` on this worker thread:
// every piece is written (and so flushed, one chunk per engine step) as soon as it exists; a
// client that disconnects ends the stream and abandons the source at once.
void stream_sse(const httplib::Request& req, httplib::Response& res, std::shared_ptr<SseSource> source);

// Polls every unfinished run without waiting; when none had an event, waits up to `wait` on the
// first unfinished one. on_text gets the run's index. Returns whether all runs are done.
using PerRunText = std::function<void(size_t run, std::string_view text, std::vector<openai::TokenLogprob> logprobs)>;
bool poll_runs(const std::vector<ChoiceRun*>& runs, std::chrono::milliseconds wait, const PerRunText& on_text);

// Waits for runs to finish (non-streaming responses), giving up when the client disconnects;
// false in that case (the runs are abandoned).
bool wait_for_runs(const httplib::Request& req, const std::vector<ChoiceRun*>& runs);

// Parameters that are accepted by the request schema but not served yet: a 400 naming them.
std::optional<openai::ApiError> unsupported_params(const openai::GenerationParams& params);

}  // namespace dsv4::serve
