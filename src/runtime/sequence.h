// One request's state in the engine: its prompt and generated tokens, sampling parameters, stop
// conditions and where it is in its life (waiting → prefilling → decoding → finished).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/sampling_params.h"
#include "checkpoint/model_config.h"

namespace dsv4 {

using SeqId = int32_t;

struct StopConditions {
  std::vector<int32_t> stop_token_ids;  // finish with "stop" after sampling one of these
  bool ignore_eos = false;              // the engine's EOS ids do not stop the request
  int64_t max_tokens = 16;              // finish with "length" after this many tokens
  // No stop (EOS or stop token) before this many tokens. The backend cannot mask logits yet, so a
  // stop token sampled earlier is kept as an ordinary token (vLLM would never sample it).
  int64_t min_tokens = 0;
};

// What a client asks for. Stop strings are matched on text by the caller, which then finishes
// the request with Engine::stop (reason "stop").
struct Request {
  std::vector<int32_t> prompt;
  SamplingParams sampling;  // temperature 0 = greedy
  StopConditions stop;
  PenaltyParams penalties;  // repetition over prompt and output, frequency and presence over the output
  int logprobs = -1;        // ≥ 0: each token comes with its logprob and the top `logprobs` (≤ 20) alternatives
};
inline constexpr int kMaxLogprobs = 20;

// Throws Error naming the first problem (empty prompt, token id outside the vocabulary, length past
// max_position_embeddings, parameter out of range): caught at submit, before the request is queued.
void validate_request(const Request& r, const ModelConfig& c);

enum class SeqStatus { Waiting, Prefilling, Decoding, Finished };
enum class FinishReason { None, Stop, Length, Cancelled, Error };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

class Sequence {
 public:
  Sequence(uint64_t id, Request request);

  const uint64_t id;  // the engine's request id (not the model's SeqId, which is reused)
  const Request request;
  std::vector<int32_t> generated;
  SeqStatus status = SeqStatus::Waiting;
  int64_t prefill_cursor = 0;  // prompt tokens already run through the model
  std::optional<SeqId> slot;   // the model sequence, while this request holds one
  FinishReason reason = FinishReason::None;
  std::string error;           // with FinishReason::Error
  int32_t stop_token = -1;     // the EOS / stop token that finished it (the last generated token)
  // With logprobs: one entry per generated token (moved out as the tokens are published).
  std::vector<TokenLogprobs> generated_logprobs;
  // With penalties: the distinct prompt and output ids and their output counts, what the
  // penalty op reads; updated by append_token.
  PenaltyTokens penalty_tokens;

  int64_t prompt_len() const { return int64_t(request.prompt.size()); }
  int64_t remaining_prompt() const { return prompt_len() - prefill_cursor; }
  bool finished() const { return status == SeqStatus::Finished; }
  // Positions the model can ever run for this request: the last sampled token is never fed back.
  int64_t max_positions() const { return prompt_len() + request.stop.max_tokens - 1; }

  // Appends a sampled token (with its logprobs when the request asked) and applies the stop
  // conditions; true when the request is finished.
  bool append_token(int32_t token, const std::vector<int32_t>& eos_ids, std::optional<TokenLogprobs> logprobs = {});
  void finish(FinishReason r, std::string message = {});

 private:
  std::unordered_map<int32_t, size_t> penalty_index_;  // id → its place in penalty_tokens
};

}  // namespace dsv4
