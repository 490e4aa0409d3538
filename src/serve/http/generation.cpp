#include "serve/http/generation.h"

#include <httplib.h>

#include <climits>

#include "core/error.h"

namespace dsv4::serve {

using namespace std::chrono_literals;

namespace {

// How long a waiting handler sleeps between checks of its client: a disconnect is noticed (and
// the request cancelled) within this time even when no token is due.
constexpr std::chrono::milliseconds kPollInterval = 50ms;

double seconds_between(Clock::time_point from, Clock::time_point to) { return std::chrono::duration<double>(to - from).count(); }

Request engine_request(std::vector<int32_t> prompt, const openai::GenerationParams& p, uint64_t random_seed) {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = float(p.temperature);
  r.sampling.top_k = p.top_k > 0 ? int(std::min<int64_t>(p.top_k, INT_MAX)) : 0;
  r.sampling.top_p = float(p.top_p);
  r.sampling.min_p = float(p.min_p);
  r.sampling.seed = p.seed ? uint64_t(*p.seed) : random_seed;
  r.stop.stop_token_ids = p.stop_token_ids;
  r.stop.ignore_eos = p.ignore_eos;
  r.stop.max_tokens = p.max_tokens.value_or(16);
  r.stop.min_tokens = p.min_tokens;
  return r;
}

}  // namespace

uint64_t ServerContext::nonce() {
  std::lock_guard lock(nonce_mutex_);
  return rng_();
}

bool ServerContext::require_ready(httplib::Response& res) {
  switch (service.state()) {
    case ModelService::State::Ready: return true;
    case ModelService::State::Loading: send_error(res, openai::unavailable("The model is still loading.")); return false;
    case ModelService::State::Failed:
      send_error(res, openai::unavailable("The model failed to load: " + service.error()));
      return false;
    case ModelService::State::Stopped: send_error(res, openai::unavailable("The server is shutting down.")); return false;
  }
  return false;
}

openai::RequestLimits ServerContext::limits() const {
  return {service.max_model_len(), service.config().vocab_size};
}

bool ServerContext::check_model(const std::string& requested, httplib::Response& res) const {
  if (requested.empty() || requested == model_name) return true;
  send_error(res, openai::model_not_found(requested));
  return false;
}

void send_json(httplib::Response& res, const nlohmann::ordered_json& body, int status) {
  res.status = status;
  res.set_content(openai::dump_json(body), "application/json");
}

void send_error(httplib::Response& res, const openai::ApiError& error) {
  send_json(res, openai::error_json(error), openai::http_status(error.kind));
}

ChoiceRun::ChoiceRun(ServerContext& context, std::vector<int32_t> prompt, const openai::GenerationParams& params,
                     Clock::time_point arrival)
    : context_(context), arrival_(arrival), last_token_(arrival), text_(context.service.tokenizer(), params.stop) {
  usage_.prompt_tokens = int64_t(prompt.size());
  try {
    handle_ = context_.service.engine().submit(engine_request(std::move(prompt), params, context_.nonce()));
  } catch (const std::exception& e) {
    done_ = true;
    if (context_.service.state() == ModelService::State::Stopped) error_ = openai::unavailable("The server is shutting down.");
    else error_ = openai::bad_request(e.what());
  }
}

ChoiceRun::~ChoiceRun() { abandon(); }

void ChoiceRun::abandon() {
  if (done_) return;
  context_.service.engine().cancel(handle_);
  done_ = true;
  error_ = openai::bad_request("The client closed the connection.");
  usage_.completion_tokens = text_.tokens();
  record_finished(FinishedReason::Abort);
}

void ChoiceRun::record_finished(FinishedReason reason) {
  FinishedRequest finished;
  finished.reason = reason;
  finished.e2e_seconds = seconds_between(arrival_, Clock::now());
  finished.prompt_tokens = usage_.prompt_tokens;
  finished.generation_tokens = usage_.completion_tokens;
  context_.metrics.observe_finished(finished);
}

bool ChoiceRun::poll(std::chrono::milliseconds wait, const OnText& on_text) {
  if (done_) return false;
  bool any = false;
  for (std::chrono::milliseconds timeout = wait; std::optional<Event> event = handle_->next(timeout); timeout = 0ms) {
    any = true;
    if (event->kind == Event::Kind::Finished) {
      handle_finished(*event, on_text);
      break;
    }
    if (text_.stopped()) continue;  // sampled before the engine saw our stop
    const Clock::time_point now = Clock::now();
    if (first_token_seen_) context_.metrics.observe_inter_token_latency(seconds_between(last_token_, now));
    else context_.metrics.observe_time_to_first_token(seconds_between(arrival_, now));
    first_token_seen_ = true;
    last_token_ = now;
    ChoiceText::Delta delta = text_.push(event->token, event->is_stop_token);
    if (delta.stopped) context_.service.engine().stop(handle_);
    if (on_text && !delta.text.empty()) on_text(delta.text, {});
  }
  return any;
}

void ChoiceRun::handle_finished(const Event& event, const OnText& on_text) {
  const std::string tail = text_.finish();
  if (on_text && !tail.empty()) on_text(tail, {});
  done_ = true;
  usage_.completion_tokens = text_.tokens();
  if (text_.stopped() || event.reason == dsv4::FinishReason::Stop) {
    reason_ = openai::FinishReason::Stop;
    record_finished(FinishedReason::Stop);
  } else if (event.reason == dsv4::FinishReason::Length) {
    reason_ = openai::FinishReason::Length;
    record_finished(FinishedReason::Length);
  } else if (event.reason == dsv4::FinishReason::Cancelled) {
    error_ = openai::unavailable("The request was cancelled: the server is shutting down.");
    record_finished(FinishedReason::Abort);
  } else {
    error_ = openai::internal_error("The engine failed while generating: " + event.error);
    record_finished(FinishedReason::Error);
  }
}

bool poll_runs(const std::vector<ChoiceRun*>& runs, std::chrono::milliseconds wait, const PerRunText& on_text) {
  bool any = false;
  ChoiceRun* first_unfinished = nullptr;
  size_t first_index = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i]->done()) continue;
    if (first_unfinished == nullptr) first_unfinished = runs[i], first_index = i;
    auto text = [&, i](std::string_view t, std::vector<openai::TokenLogprob> l) { on_text(i, t, std::move(l)); };
    any |= runs[i]->poll(0ms, on_text ? ChoiceRun::OnText(text) : ChoiceRun::OnText());
  }
  if (!any && first_unfinished != nullptr) {
    auto text = [&](std::string_view t, std::vector<openai::TokenLogprob> l) { on_text(first_index, t, std::move(l)); };
    first_unfinished->poll(wait, on_text ? ChoiceRun::OnText(text) : ChoiceRun::OnText());
  }
  for (ChoiceRun* run : runs)
    if (!run->done()) return false;
  return true;
}

bool wait_for_runs(const httplib::Request& req, const std::vector<ChoiceRun*>& runs) {
  ClientConnection connection(req);
  while (!poll_runs(runs, kPollInterval, {})) {
    if (connection.gone()) {
      for (ChoiceRun* run : runs) run->abandon();
      return false;
    }
  }
  return true;
}

void stream_sse(const httplib::Request& req, httplib::Response& res, std::shared_ptr<SseSource> source) {
  // cpp-httplib compresses text/* responses for clients that accept gzip or br, and its
  // compressor holds bytes back until it has a block: events would arrive late and in bursts.
  // Dropping Accept-Encoding from this request keeps the stream as it is written. (The request
  // is the server's own mutable object; handlers only get a const view of it.)
  const_cast<httplib::Request&>(req).headers.erase("Accept-Encoding");
  auto connection = std::make_shared<ClientConnection>(req);
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [source, connection](size_t, httplib::DataSink& sink) {
        if (connection->gone()) return false;
        bool finished = false;
        const std::string bytes = source->next(kPollInterval, finished);
        if (!bytes.empty() && !sink.write(bytes.data(), bytes.size())) return false;
        if (finished) sink.done();
        return true;
      },
      [source](bool) { source->abandon(); });
}

std::optional<openai::ApiError> unsupported_params(const openai::GenerationParams& params) {
  if (params.logprobs) return openai::bad_request("'logprobs' is not supported yet.", "logprobs");
  if (params.presence_penalty != 0) return openai::bad_request("'presence_penalty' is not supported yet.", "presence_penalty");
  if (params.frequency_penalty != 0) return openai::bad_request("'frequency_penalty' is not supported yet.", "frequency_penalty");
  if (params.repetition_penalty != 1) return openai::bad_request("'repetition_penalty' is not supported yet.", "repetition_penalty");
  return std::nullopt;
}

}  // namespace dsv4::serve
