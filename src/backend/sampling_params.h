// Per-request sampling parameters, as every backend's sample op takes them (the algorithm is
// defined in backend/cpu/sampling_reference.h, which the CUDA kernel reproduces exactly).
#pragma once
#include <cstdint>
#include <vector>

namespace dsv4 {

struct SamplingParams {
  float temperature = 0;  // ≤ 0: greedy
  int top_k = 0;          // ≤ 0: off
  float top_p = 1;        // ≥ 1: off
  float min_p = 0;        // ≤ 0: off
  uint64_t seed = 0;
};

// Repetition, frequency and presence penalties (vLLM's definitions), applied to a row's logits
// before sampling (Backend::apply_penalties; per logit: sampling::penalized_logit).
struct PenaltyParams {
  float repetition = 1;  // > 0: every prompt or output token's logit l becomes l / r (l > 0) or l · r
  float frequency = 0;   // an output token's logit minus frequency × the times it was generated
  float presence = 0;    // an output token's logit minus presence, once
};
inline bool penalties_active(const PenaltyParams& p) { return p.repetition != 1 || p.frequency != 0 || p.presence != 0; }

// The tokens a row's penalties touch: each distinct id of the prompt and of the output once, with
// how many times it was generated (0: only in the prompt).
struct PenaltyTokens {
  std::vector<int32_t> ids;
  std::vector<int32_t> output_counts;
};

// Log-probabilities of one row: log-softmax at temperature 1 of the raw logits (before penalties
// and sampling filters, vLLM's default), for the sampled token and the row's most likely ones.
struct TokenLogprobs {
  float chosen = 0;
  std::vector<int32_t> top_ids;  // canonical order: logit descending, id ascending
  std::vector<float> top;        // their logprobs
};

}  // namespace dsv4
