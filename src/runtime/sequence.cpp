#include "runtime/sequence.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dsv4 {

void validate_request(const Request& r, const ModelConfig& c) {
  DSV4_CHECK(!r.prompt.empty(), "the prompt is empty");
  for (int32_t t : r.prompt)
    DSV4_CHECK(t >= 0 && t < c.vocab_size, "prompt token id {} outside the vocabulary (0..{})", t, c.vocab_size - 1);
  for (int32_t t : r.stop.stop_token_ids)
    DSV4_CHECK(t >= 0 && t < c.vocab_size, "stop token id {} outside the vocabulary (0..{})", t, c.vocab_size - 1);
  const StopConditions& s = r.stop;
  DSV4_CHECK(s.max_tokens >= 1, "max_tokens must be ≥ 1, got {}", s.max_tokens);
  DSV4_CHECK(s.min_tokens >= 0 && s.min_tokens <= s.max_tokens, "min_tokens must be in 0..max_tokens ({}), got {}",
             s.max_tokens, s.min_tokens);
  // Subtraction form: a huge max_tokens must not overflow.
  DSV4_CHECK(s.max_tokens <= c.max_position_embeddings - int64_t(r.prompt.size()),
             "prompt ({} tokens) + max_tokens ({}) exceeds the model length {}", r.prompt.size(), s.max_tokens,
             c.max_position_embeddings);
  const SamplingParams& p = r.sampling;
  DSV4_CHECK(std::isfinite(p.temperature) && p.temperature >= 0, "temperature must be a finite value ≥ 0, got {}",
             p.temperature);
  DSV4_CHECK(std::isfinite(p.top_p) && p.top_p > 0 && p.top_p <= 1, "top_p must be in (0, 1], got {}", p.top_p);
  DSV4_CHECK(std::isfinite(p.min_p) && p.min_p >= 0 && p.min_p <= 1, "min_p must be in [0, 1], got {}", p.min_p);
  DSV4_CHECK(p.top_k >= -1, "top_k must be -1 or 0 (off) or a positive count, got {}", p.top_k);
  const PenaltyParams& q = r.penalties;
  DSV4_CHECK(std::isfinite(q.repetition) && q.repetition > 0, "repetition_penalty must be a finite value > 0, got {}", q.repetition);
  DSV4_CHECK(std::isfinite(q.frequency) && std::isfinite(q.presence), "frequency and presence penalties must be finite, got {} and {}",
             q.frequency, q.presence);
  DSV4_CHECK(r.logprobs >= -1 && r.logprobs <= kMaxLogprobs, "logprobs must be -1 (none) or 0..{}, got {}", kMaxLogprobs, r.logprobs);
}

Sequence::Sequence(uint64_t id, Request request) : id(id), request(std::move(request)) {
  if (!penalties_active(this->request.penalties)) return;
  for (int32_t t : this->request.prompt)
    if (penalty_index_.emplace(t, penalty_tokens.ids.size()).second) {
      penalty_tokens.ids.push_back(t);
      penalty_tokens.output_counts.push_back(0);
    }
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "none";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "?";
}

bool Sequence::append_token(int32_t token, const std::vector<int32_t>& eos_ids, std::optional<TokenLogprobs> logprobs) {
  generated.push_back(token);
  if (request.logprobs >= 0) generated_logprobs.push_back(logprobs ? std::move(*logprobs) : TokenLogprobs{});
  if (penalties_active(request.penalties)) {
    auto [at, added] = penalty_index_.emplace(token, penalty_tokens.ids.size());
    if (added) {
      penalty_tokens.ids.push_back(token);
      penalty_tokens.output_counts.push_back(0);
    }
    ++penalty_tokens.output_counts[at->second];
  }
  const StopConditions& s = request.stop;
  auto in = [token](const std::vector<int32_t>& ids) { return std::find(ids.begin(), ids.end(), token) != ids.end(); };
  if (int64_t(generated.size()) >= s.min_tokens && (in(s.stop_token_ids) || (!s.ignore_eos && in(eos_ids)))) {
    stop_token = token;
    finish(FinishReason::Stop);
  } else if (int64_t(generated.size()) >= s.max_tokens) {
    finish(FinishReason::Length);
  }
  return finished();
}

void Sequence::finish(FinishReason r, std::string message) {
  status = SeqStatus::Finished;
  reason = r;
  error = std::move(message);
}

}  // namespace dsv4
