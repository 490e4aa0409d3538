// Generation for the terminal commands (generate, chat): one model sequence driven directly, the
// prompt prefilled in chunks (a progress callback after each, and Ctrl-C checked between steps),
// then one decode step per token with a callback per token. The model is used on the caller's
// thread, so stopping is simply not taking the next step: nothing is left half-run.
#pragma once
#include <signal.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "backend/sampling_params.h"
#include "model/dsv4.h"
#include "serve/chat_output_parser.h"
#include "serve/detokenizer.h"

namespace dsv4::commands {

// Ctrl-C while a command generates. While an InterruptGuard lives, the first SIGINT only sets a
// flag (the generation loop stops after the step in flight, keeping what it has); a second one
// ends the process as the default action does, for a step that takes too long. Blocking reads
// return EINTR instead of restarting, so a prompt can notice it too. One guard at a time.
class InterruptGuard {
 public:
  InterruptGuard();   // installs the handler (the flag cleared)
  ~InterruptGuard();  // restores the previous handler
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
  bool raised() const;
  void rearm();  // clears the flag and makes the next SIGINT a flag again

 private:
  struct sigaction previous_;
};

enum class StopReason { Eos, Length, Interrupted };
const char* stop_reason_name(StopReason r);  // "eos", "length", "interrupted"

struct GenerationLimits {
  int64_t max_tokens = 32;
  bool ignore_eos = false;
  int64_t prefill_chunk = 2048;  // prompt tokens per step
  int64_t max_positions = 0;     // the context length (0: the model's max_position_embeddings)
};

struct GenerationCallbacks {
  std::function<void(int64_t done, int64_t total)> on_prefill;  // after each prefill chunk
  std::function<void(int32_t token)> on_token;                  // each sampled token, EOS included
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // the sampled tokens, the EOS included when it stopped there
  StopReason reason = StopReason::Length;
  int64_t prompt_tokens = 0;    // tokens of the prompt run through the model by this call
  int64_t reused_tokens = 0;    // tokens of the prompt already in the cache
  double prefill_seconds = 0, decode_seconds = 0;
  double prefill_rate() const { return prefill_seconds > 0 ? double(prompt_tokens) / prefill_seconds : 0; }
  // Tokens after the first (which the prefill step sampled) per second of decode steps.
  double decode_rate() const { return tokens.size() > 1 && decode_seconds > 0 ? double(tokens.size() - 1) / decode_seconds : 0; }
};

// One model sequence and the tokens its cache holds, kept across calls: a prompt that extends
// them (the next turn of a chat) only runs its new tokens.
class ModelSequence {
 public:
  explicit ModelSequence(Dsv4Model& model);
  ~ModelSequence();
  ModelSequence(const ModelSequence&) = delete;
  ModelSequence& operator=(const ModelSequence&) = delete;

  const std::vector<int32_t>& cached() const { return cached_; }
  void reset();  // a fresh sequence, nothing cached

  // Generates from `prompt` until EOS (unless ignore_eos), max_tokens, the context length, or
  // Ctrl-C (`interrupt` may be null). The draw counter of each sample is its index in this call's
  // output, so a seed gives the same tokens on every backend. Throws Error for a prompt that does
  // not fit the context, or one with ids outside the model's vocabulary.
  GenerationResult generate(const std::vector<int32_t>& prompt, const SamplingParams& sampling,
                            const GenerationLimits& limits, const GenerationCallbacks& callbacks,
                            const InterruptGuard* interrupt);

 private:
  Dsv4Model& model_;
  SeqId seq_;
  std::vector<int32_t> cached_;  // tokens run through the model, in order
};

// Sampled ids to printable text as they come: the streaming detokenizer, with the marker of
// cli_options.h for ids the tokenizer has no text for, and with the chat encoding the output
// parser, which splits the reasoning from the answer. Without it everything is content.
// A conversation message with only what the terminal commands set (designated initializers of
// chat::Message warn about the fields they leave out).
chat::Message make_message(std::string role, std::string content, std::string reasoning = "");

class TokenTextStream {
 public:
  TokenTextStream(const Tokenizer& tokenizer, std::optional<chat::ThinkingMode> chat_mode);
  chat::OutputDelta push(int32_t id);
  chat::OutputDelta finish();  // what was held back

 private:
  chat::OutputDelta parse(std::string text, bool final);
  const Tokenizer& tokenizer_;
  StreamingDetokenizer detokenizer_;
  std::optional<chat::OutputParser> parser_;
};

}  // namespace dsv4::commands
