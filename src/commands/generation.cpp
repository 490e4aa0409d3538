#include "commands/generation.h"

#include <algorithm>
#include <chrono>
#include <csignal>

#include "commands/cli_options.h"
#include "core/error.h"

namespace dsv4::commands {

namespace {

// A signal handler can only set a flag that outlives every object: this one, read by
// InterruptGuard::raised (the only global besides the logger's level).
volatile std::sig_atomic_t g_interrupted = 0;

void on_sigint(int) { g_interrupted = 1; }

void install_handler() {
  struct sigaction action {};
  action.sa_handler = on_sigint;
  sigemptyset(&action.sa_mask);
  // One-shot (the second Ctrl-C gets the default action) and no SA_RESTART (a blocking read
  // returns EINTR, so a prompt sees the Ctrl-C at once).
  action.sa_flags = SA_RESETHAND;
  sigaction(SIGINT, &action, nullptr);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

InterruptGuard::InterruptGuard() {
  g_interrupted = 0;
  sigaction(SIGINT, nullptr, &previous_);
  install_handler();
}

InterruptGuard::~InterruptGuard() { sigaction(SIGINT, &previous_, nullptr); }

bool InterruptGuard::raised() const { return g_interrupted != 0; }

void InterruptGuard::rearm() {
  g_interrupted = 0;
  install_handler();
}

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::Eos: return "eos";
    case StopReason::Length: return "length";
    case StopReason::Interrupted: return "interrupted";
  }
  return "?";
}

ModelSequence::ModelSequence(Dsv4Model& model) : model_(model), seq_(model.new_sequence()) {}

ModelSequence::~ModelSequence() { model_.free_sequence(seq_); }

void ModelSequence::reset() {
  model_.free_sequence(seq_);
  seq_ = model_.new_sequence();
  cached_.clear();
}

GenerationResult ModelSequence::generate(const std::vector<int32_t>& prompt, const SamplingParams& sampling,
                                         const GenerationLimits& limits, const GenerationCallbacks& callbacks,
                                         const InterruptGuard* interrupt) {
  const ModelConfig& c = model_.config();
  const int64_t max_positions = limits.max_positions > 0 ? std::min<int64_t>(limits.max_positions, c.max_position_embeddings)
                                                         : c.max_position_embeddings;
  if (prompt.empty()) fail("the prompt is empty");
  for (int32_t id : prompt)
    if (id < 0 || id >= c.vocab_size) fail("token id {} is outside the vocabulary (0 to {})", id, c.vocab_size - 1);
  if (int64_t(prompt.size()) > max_positions)
    fail("the prompt has {} tokens, more than the context length ({})", prompt.size(), max_positions);
  const bool extends_cache = cached_.size() < prompt.size() && std::equal(cached_.begin(), cached_.end(), prompt.begin());
  if (!extends_cache && !cached_.empty()) reset();

  GenerationResult result;
  result.reused_tokens = int64_t(cached_.size());
  auto stopped = [&] { return interrupt && interrupt->raised(); };
  auto item = [&](std::vector<int32_t> tokens, bool sample) {
    BatchItem b{seq_, std::move(tokens)};
    b.return_logits = false;
    if (sample) b.sampling = sampling;
    b.sample_counter = uint64_t(result.tokens.size());
    return b;
  };
  auto run = [&](std::vector<int32_t> tokens, bool sample) {
    StepOutput out = model_.step({item(tokens, sample)});
    cached_.insert(cached_.end(), tokens.begin(), tokens.end());
    return out.tokens[0];
  };

  // Prefill: chunks of the new tokens; the last chunk samples the first output token.
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t total = int64_t(prompt.size()) - result.reused_tokens;
  const int64_t chunk = std::max<int64_t>(1, limits.prefill_chunk);
  int32_t next = -1;
  for (int64_t done = 0; done < total;) {
    if (stopped()) {
      result.reason = StopReason::Interrupted;
      result.prefill_seconds = seconds_since(t0);
      return result;
    }
    const int64_t n = std::min(chunk, total - done);
    const auto first = prompt.begin() + result.reused_tokens + done;
    next = run(std::vector<int32_t>(first, first + n), done + n == total);
    done += n;
    result.prompt_tokens = done;
    if (callbacks.on_prefill) callbacks.on_prefill(done, total);
  }
  result.prefill_seconds = seconds_since(t0);

  // Decode: one step per token; each stop condition is checked before the next step.
  const auto t1 = std::chrono::steady_clock::now();
  while (true) {
    result.tokens.push_back(next);
    if (callbacks.on_token) callbacks.on_token(next);
    if (next == c.eos_token_id && !limits.ignore_eos) {
      result.reason = StopReason::Eos;
      break;
    }
    if (int64_t(result.tokens.size()) >= limits.max_tokens || int64_t(cached_.size()) >= max_positions) {
      result.reason = StopReason::Length;
      break;
    }
    if (stopped()) {
      result.reason = StopReason::Interrupted;
      break;
    }
    next = run({next}, true);
  }
  result.decode_seconds = seconds_since(t1);
  return result;
}

chat::Message make_message(std::string role, std::string content, std::string reasoning) {
  chat::Message m;
  m.role = std::move(role);
  m.content = std::move(content);
  m.reasoning_content = std::move(reasoning);
  return m;
}

TokenTextStream::TokenTextStream(const Tokenizer& tokenizer, std::optional<chat::ThinkingMode> chat_mode)
    : tokenizer_(tokenizer), detokenizer_(tokenizer) {
  if (chat_mode) parser_.emplace(*chat_mode);
}

chat::OutputDelta TokenTextStream::parse(std::string text, bool final) {
  if (!parser_) {
    chat::OutputDelta delta;
    delta.content = std::move(text);
    return delta;
  }
  chat::OutputDelta delta = parser_->push(text);
  if (final) delta.append(parser_->finish());
  return delta;
}

chat::OutputDelta TokenTextStream::push(int32_t id) {
  if (tokenizer_.is_known(id)) return parse(detokenizer_.push(id), false);
  return parse(detokenizer_.finish() + textless_token_marker(id), false);
}

chat::OutputDelta TokenTextStream::finish() { return parse(detokenizer_.finish(), true); }

}  // namespace dsv4::commands
