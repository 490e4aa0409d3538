// GPU sampler: one block per row (after a pass that finds each row's greedy token with many blocks). Every selection the definition needs (the top-k cut, the top-p
// cut, the draw) is "the first token in canonical order whose cumulative value reaches a target"
// over a domain of tokens, found without sorting by a radix descent over the 64-bit order key,
// 4 bits per pass: histogram the domain's tokens in the current key range into 16 bins (per-thread
// private bins in shared memory, so no atomics and no contention on the few bins a concentrated
// logit distribution fills), walk the bins from the highest key down accumulating value until the
// target is reached, narrow the range to that bin, repeat; stop as soon as the range holds one token.
// Values are integer masses (or 1 for top-k), so the sums are exact and the choice is the CPU twin's.
#include "backend/cuda/sampling.h"

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/ptx_primitives.cuh"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

using namespace dsv4::sampling;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kDigitBits = 4;
constexpr int kBins = 1 << kDigitBits;
// Per-thread bin counts are uint16: a thread sees at most ceil(vocab / kThreads) tokens.
constexpr int kMaxVocab = 1 << 23;

// The tokens a selection walks: candidates (mass > 0) at or after key_floor in canonical order,
// and, once min-p applies, with p ≥ min_p.
struct Domain {
  uint64_t key_floor = 0;
  bool use_min_p = false;
  float min_p = 0;
};

enum class TargetKind { TopK, TopP, Draw };
struct TargetRule {
  TargetKind kind;
  uint64_t top_k_or_hash;
  float top_p;
};

enum SelectState : int { kContinue = 0, kUnique = 1, kExact = 2, kNotFound = 3 };

struct SelectShared {
  uint64_t thread_value[kBins][kThreads];
  uint16_t thread_count[kBins][kThreads];
  uint64_t bin_value[kBins];
  uint32_t bin_count[kBins];
  uint64_t prefix, mask, before, target, total, cum, key;
  int state;
};

struct Selection {
  bool found;
  uint64_t key;    // the selected token's order key
  uint64_t cum;    // cumulative value through it
  uint64_t total;  // the domain's total value
};

__device__ __forceinline__ bool in_domain(float p, uint64_t q, uint64_t key, const Domain& d) {
  return q > 0 && key >= d.key_floor && (!d.use_min_p || p >= d.min_p);
}

__device__ uint64_t target_for(const TargetRule& rule, uint64_t total) {
  switch (rule.kind) {
    case TargetKind::TopK: return rule.top_k_or_hash;
    case TargetKind::TopP: return top_p_target(rule.top_p, total);
    case TargetKind::Draw: return scale_draw(rule.top_k_or_hash, total) + 1;  // cum > r ⇔ cum ≥ r + 1
  }
  return 0;
}

// Thread 0, after the bins of the pass at `shift` are reduced: pick the bin in which the running
// value reaches the target (bins of higher keys come first in canonical order).
__device__ void walk_bins(SelectShared& sh, int shift, const TargetRule& rule) {
  if (shift == 64 - kDigitBits) {
    uint64_t total = 0;
    for (int b = 0; b < kBins; ++b) total += sh.bin_value[b];
    sh.total = total;
    sh.target = total == 0 ? 0 : target_for(rule, total);
    if (sh.target == 0 || sh.target > total) {
      sh.state = kNotFound;
      return;
    }
  }
  uint64_t before = sh.before;
  for (int b = kBins - 1; b >= 0; --b) {
    if (sh.bin_count[b] > 0 && before + sh.bin_value[b] >= sh.target) {
      sh.prefix |= uint64_t(b) << shift;
      sh.mask |= uint64_t(kBins - 1) << shift;
      sh.before = before;
      if (sh.bin_count[b] == 1 || shift == 0) {
        sh.cum = before + sh.bin_value[b];
        sh.state = sh.bin_count[b] == 1 ? kUnique : kExact;
      }
      return;
    }
    before += sh.bin_value[b];
  }
  sh.state = kNotFound;  // unreachable: the range's value reaches the target by construction
}

// The first token of the domain (canonical order) whose cumulative value reaches the rule's target;
// value = 1 per token (count_values) or its mass. Block-wide: every thread calls it.
__device__ Selection select_first_reaching(const float* logits, const float* probs, int vocab, const Domain& dom,
                                           bool count_values, const TargetRule& rule, SelectShared& sh) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  __syncthreads();  // the previous user of sh is done reading it
  if (tid == 0) {
    sh.prefix = 0;
    sh.mask = 0;
    sh.before = 0;
    sh.state = kContinue;
  }
  __syncthreads();
  for (int shift = 64 - kDigitBits; shift >= 0; shift -= kDigitBits) {
    const uint64_t prefix = sh.prefix, mask = sh.mask;
    for (int b = 0; b < kBins; ++b) {
      sh.thread_value[b][tid] = 0;
      sh.thread_count[b][tid] = 0;
    }
    for (int i = tid; i < vocab; i += kThreads) {
      const float p = probs[i];
      const uint64_t q = token_mass(p);
      const uint64_t key = order_key(logits[i], i);
      if (!in_domain(p, q, key, dom) || (key & mask) != prefix) continue;
      const int b = int(key >> shift) & (kBins - 1);
      sh.thread_value[b][tid] += count_values ? 1 : q;
      sh.thread_count[b][tid] = uint16_t(sh.thread_count[b][tid] + 1);
    }
    __syncthreads();
    for (int b = warp; b < kBins; b += kWarps) {
      uint64_t value = 0;
      uint32_t count = 0;
      for (int j = lane; j < kThreads; j += 32) {
        value += sh.thread_value[b][j];
        count += sh.thread_count[b][j];
      }
#pragma unroll
      for (int o = 16; o; o >>= 1) {
        value += __shfl_xor_sync(0xffffffffu, value, o);
        count += __shfl_xor_sync(0xffffffffu, count, o);
      }
      if (lane == 0) {
        sh.bin_value[b] = value;
        sh.bin_count[b] = count;
      }
    }
    __syncthreads();
    if (tid == 0) walk_bins(sh, shift, rule);
    __syncthreads();
    if (sh.state != kContinue) break;
  }
  const int state = sh.state;
  Selection s{state != kNotFound, sh.prefix, sh.cum, sh.total};
  if (state == kUnique) {
    // The range holds one token of the domain; its low key bits are not decided yet: find it.
    const uint64_t prefix = sh.prefix, mask = sh.mask;
    for (int i = tid; i < vocab; i += kThreads) {
      const float p = probs[i];
      const uint64_t key = order_key(logits[i], i);
      if (in_domain(p, token_mass(p), key, dom) && (key & mask) == prefix) sh.key = key;
    }
    __syncthreads();
    s.key = sh.key;
  }
  return s;
}

// The largest order key (= the greedy token) of each of kKeyChunks slices of every row, a block per
// slice: one block per row over a 129K vocabulary is a chain of dependent loads (65 µs for a decode
// step's row on the H200), a block per slice is one round of them.
constexpr int kKeyChunks = 32;

__global__ void __launch_bounds__(kThreads) chunk_max_keys_kernel(const float* __restrict__ logits, int vocab,
                                                                  uint64_t* __restrict__ keys) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ uint64_t warp_key[kWarps];
  const int64_t row = blockIdx.y;
  const int per = (vocab + kKeyChunks - 1) / kKeyChunks, begin = int(blockIdx.x) * per, end = min(vocab, begin + per);
  const float* l = logits + row * vocab;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  uint64_t best = 0;
#pragma unroll 8
  for (int i = begin + tid; i < end; i += kThreads) best = max(best, order_key(l[i], i));
#pragma unroll
  for (int o = 16; o; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
  if (lane == 0) warp_key[warp] = best;
  __syncthreads();
  if (tid == 0) {
    uint64_t b = warp_key[0];
    for (int w = 1; w < kWarps; ++w) b = max(b, warp_key[w]);
    keys[row * kKeyChunks + blockIdx.x] = b;
  }
}

// The row's largest order key from its slices' (chunk_max_keys_kernel), block-wide.
__device__ uint64_t row_max_key(const uint64_t* keys, SelectShared& sh) {
  if (threadIdx.x < 32) {
    uint64_t best = threadIdx.x < kKeyChunks ? keys[threadIdx.x] : 0;
#pragma unroll
    for (int o = 16; o; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
    if (threadIdx.x == 0) sh.key = best;
  }
  __syncthreads();
  return sh.key;
}

__global__ void __launch_bounds__(kThreads) sample_tokens_kernel(const float* __restrict__ logits, int vocab,
                                                                 const SamplingParams* __restrict__ params,
                                                                 const uint64_t* __restrict__ counters,
                                                                 int32_t* __restrict__ out, float* __restrict__ probs_all,
                                                                 const uint64_t* __restrict__ keys) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ SelectShared sh;
  const int64_t row = blockIdx.x;
  const float* l = logits + row * vocab;
  float* probs = probs_all + row * vocab;
  const SamplingParams sp = params[row];

  const int best_id = key_token(row_max_key(keys + row * kKeyChunks, sh));
  const float max_logit = sanitize_logit(l[best_id]);
  if (is_greedy(sp, max_logit)) {
    if (threadIdx.x == 0) out[row] = best_id;
    return;
  }
  // Each thread later reads back exactly the probabilities it wrote (same stride), so no barrier
  // is needed for them; select_first_reaching starts with one anyway.
  for (int i = threadIdx.x; i < vocab; i += kThreads) probs[i] = token_weight(l[i], max_logit, sp.temperature);

  Domain dom;
  if (sp.top_k > 0) {
    const Selection s = select_first_reaching(l, probs, vocab, dom, true, {TargetKind::TopK, uint64_t(sp.top_k), 0.f}, sh);
    if (s.found) dom.key_floor = s.key;  // not found: fewer candidates than top_k, nothing cut
  }
  if (min_p_active(sp)) {
    dom.use_min_p = true;
    dom.min_p = min_p_threshold(sp);
  }
  if (top_p_active(sp)) {
    const Selection s = select_first_reaching(l, probs, vocab, dom, false, {TargetKind::TopP, 0, sp.top_p}, sh);
    if (s.found) dom.key_floor = s.key;
  }
  const TargetRule draw{TargetKind::Draw, sampling_hash(sp.seed, counters[row]), 0.f};
  const Selection s = select_first_reaching(l, probs, vocab, dom, false, draw, sh);
  // Not found is unreachable (the maximum, mass 2^40, is always in the domain).
  if (threadIdx.x == 0) out[row] = s.found ? key_token(s.key) : best_id;
}

// Workspace: the probabilities [rows, vocab] f32, then the slices' maximum keys [rows, kKeyChunks].
size_t probs_bytes(int64_t rows, int vocab) { return (size_t(rows) * size_t(vocab) * sizeof(float) + 255) / 256 * 256; }

}  // namespace

size_t sampling_workspace_bytes(int64_t rows, int vocab) {
  return probs_bytes(rows, vocab) + (size_t(rows) * kKeyChunks * sizeof(uint64_t) + 255) / 256 * 256;
}

void sample_tokens(const float* logits, int64_t rows, int vocab, const SamplingParams* params, const uint64_t* counters,
                   int32_t* out, void* workspace, cudaStream_t stream) {
  if (rows < 0 || rows > 65535 || vocab <= 0 || vocab > kMaxVocab)
    fail("sample_tokens: {} rows × vocab {} (rows 0 … 65535, vocab 1 … {})", rows, vocab, kMaxVocab);
  if (rows == 0) return;
  auto* keys = reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(workspace) + probs_bytes(rows, vocab));
  launch_programmatic(chunk_max_keys_kernel, dim3(kKeyChunks, unsigned(rows)), dim3(kThreads), 0, stream, logits, vocab,
                      keys);
  DSV4_CUDA_CHECK_LAUNCH();
  launch_programmatic(sample_tokens_kernel, dim3(unsigned(rows)), dim3(kThreads), 0, stream, logits, vocab, params,
                      counters, out, static_cast<float*>(workspace), static_cast<const uint64_t*>(keys));
  DSV4_CUDA_CHECK_LAUNCH();
}

}  // namespace dsv4::cuda
