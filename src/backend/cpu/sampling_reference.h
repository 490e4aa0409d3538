// Token sampling with per-row parameters: the CPU twin of backend/cuda/sampling.h. Both backends
// must pick the same token for the same (logits, parameters, seed, counter), so the algorithm is
// defined to need no floating-point summation at all:
//
//   canonical order  tokens by (logit descending, id ascending); NaN logits count as −inf, −0 as +0.
//   greedy           temperature ≤ 0 (or NaN), or a non-finite maximum logit: the first token in
//                    canonical order (argmax, ties → lowest id).
//   probabilities    p_i = exp_det((l_i − max) / T) in f32, exp_det below (an exp made of explicitly
//                    rounded f32 operations, so the GPU and the CPU compute the same bits; p of the
//                    maximum is exactly 1).
//   mass             q_i = floor(p_i · 2^40), an integer: every sum below is an exact uint64 sum, the
//                    same in any order. Tokens with q_i = 0 (p < 2^-40 ≈ 9e-13) are dropped first.
//   top_k > 0        keep the first top_k candidates in canonical order.
//   min_p > 0        keep those with p_i ≥ min(min_p, 1) (p_max = 1, so this is p_i ≥ min_p · p_max).
//   top_p < 1        keep the shortest canonical prefix whose mass reaches
//                    max(1, ceil(top_p · Σq)) (top_p ≤ 0 keeps one token).
//   draw             r = ⌊h · M / 2^64⌋ with h = sampling_hash(seed, counter) and M the kept mass;
//                    the token is the first kept one whose cumulative mass exceeds r.
//
// `counter` is the number of tokens the sequence has generated so far, so a request draws the same
// tokens alone or in any batch. The inline helpers are shared with the CUDA kernel (host/device).
#pragma once
#include <cstdint>
#include <cmath>
#include <cstring>

#include "backend/sampling_params.h"

#if defined(__CUDACC__)
#define DSV4_SAMPLING_HD __host__ __device__ __forceinline__
#else
#define DSV4_SAMPLING_HD inline
#endif

namespace dsv4 {


// logits f32 [rows, vocab], params [rows], counters [rows] → out [rows] (host memory).
void sample_reference(const float* logits, int64_t rows, int vocab, const SamplingParams* params,
                      const uint64_t* counters, int32_t* out);

// Penalties on one row (host memory): each listed id's logit through sampling::penalized_logit.
// ids are distinct and inside the vocabulary (checked).
void apply_penalties_reference(float* logits, int vocab, const PenaltyParams& params, const int32_t* ids,
                               const int32_t* output_counts, int64_t n);

// Log-probabilities of one row (host memory), defined as: m = the maximum logit in canonical order
// (NaN as −inf); when m is not finite, 0 for the tokens equal to m and −inf for the rest; otherwise
// lse = m + log(Σ_i exp(l_i − m)) in double, logprob_i = float(l_i − lse). The GPU twin takes f32
// exponentials and sums in another order, so the two agree to ~1e-6, not bit for bit. top_n ≤ vocab.
TokenLogprobs logprobs_reference(const float* logits, int vocab, int32_t chosen, int top_n);

namespace sampling {

// Explicitly rounded f32 operations: on the GPU the _rn intrinsics (never fused into FMAs); on the
// host through a volatile, which stops the compiler contracting a·b + c where the target has FMA
// (aarch64, or x86 built with -mfma).
DSV4_SAMPLING_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  volatile float r = a * b;
  return r;
#endif
}
DSV4_SAMPLING_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  volatile float r = a + b;
  return r;
#endif
}
DSV4_SAMPLING_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  volatile float r = a - b;
  return r;
#endif
}
DSV4_SAMPLING_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  volatile float r = a / b;
  return r;
#endif
}
DSV4_SAMPLING_HD uint32_t float_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
#endif
}
DSV4_SAMPLING_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, 4);
  return v;
#endif
}

DSV4_SAMPLING_HD float sanitize_logit(float l) {
  if (l != l) return bits_float(0xff800000u);  // NaN → −inf
  return l == 0.0f ? 0.0f : l;                 // −0 → +0, so the sign of zero breaks no tie
}

// Sort key of the canonical order: larger key = earlier. The logit's bits made monotone as an
// unsigned integer, then the complement of the id (lower id first among equal logits). Distinct per id.
DSV4_SAMPLING_HD uint64_t order_key(float logit, int id) {
  const uint32_t u = float_bits(sanitize_logit(logit));
  const uint32_t monotone = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (uint64_t(monotone) << 32) | uint64_t(0xffffffffu - uint32_t(id));
}
DSV4_SAMPLING_HD int key_token(uint64_t key) { return int(0xffffffffu - uint32_t(key & 0xffffffffu)); }

// exp(x) for x ≤ 0 from explicitly rounded f32 operations: x = n·ln2 + r (Cody–Waite, ln2_hi has 16
// significant bits so n·ln2_hi is exact), Taylor degree 7 in Horner form (|r| ≤ 0.35: truncation
// ≈ 2e-9), × 2^n from the exponent bits. Accuracy ~1 ulp; what matters is that both sides get the
// same bits. Returns 0 below −87 (well under the 2^-40 mass floor), 1 for x = 0.
DSV4_SAMPLING_HD float exp_det(float x) {
  if (!(x >= -87.0f)) return 0.0f;
  if (x > 0.0f) x = 0.0f;
  const float n = floorf(add_rn(mul_rn(x, 1.44269502f), 0.5f));
  const float r = sub_rn(sub_rn(x, mul_rn(n, 0.693145751953125f)), mul_rn(n, 1.42860677e-06f));
  float poly = 1.98412701e-04f;                  // 1/7!
  poly = add_rn(mul_rn(poly, r), 1.38888892e-03f);  // 1/6!
  poly = add_rn(mul_rn(poly, r), 8.33333377e-03f);  // 1/5!
  poly = add_rn(mul_rn(poly, r), 4.16666679e-02f);  // 1/4!
  poly = add_rn(mul_rn(poly, r), 1.66666672e-01f);  // 1/3!
  poly = add_rn(mul_rn(poly, r), 0.5f);
  poly = add_rn(mul_rn(poly, r), 1.0f);
  poly = add_rn(mul_rn(poly, r), 1.0f);
  const int e = int(n);  // in [−126, 0] for x ≥ −87
  return mul_rn(poly, bits_float(uint32_t(e + 127) << 23));
}

// The probability weight of a token given the row's maximum logit and the temperature.
DSV4_SAMPLING_HD float token_weight(float logit, float max_logit, float temperature) {
  return exp_det(div_rn(sub_rn(sanitize_logit(logit), max_logit), temperature));
}

// q = floor(p · 2^40); the multiplication by a power of two is exact.
DSV4_SAMPLING_HD uint64_t token_mass(float p) {
#if defined(__CUDA_ARCH__)
  return __float2ull_rz(__fmul_rn(p, 1099511627776.0f));
#else
  return uint64_t(p * 1099511627776.0f);
#endif
}

DSV4_SAMPLING_HD bool min_p_active(const SamplingParams& s) { return s.min_p > 0.0f; }
DSV4_SAMPLING_HD float min_p_threshold(const SamplingParams& s) { return s.min_p < 1.0f ? s.min_p : 1.0f; }
DSV4_SAMPLING_HD bool top_p_active(const SamplingParams& s) { return s.top_p < 1.0f; }
DSV4_SAMPLING_HD bool is_greedy(const SamplingParams& s, float max_logit) {
  const float inf = bits_float(0x7f800000u);
  return !(s.temperature > 0.0f) || !(max_logit > -inf && max_logit < inf);
}

// The mass the top-p prefix must reach: max(1, ceil(top_p · total)) clamped to total (one IEEE
// double multiply of correctly rounded conversions: the same on both sides).
DSV4_SAMPLING_HD uint64_t top_p_target(float top_p, uint64_t total) {
  const double tp = top_p > 0.0f ? double(top_p) : 0.0;
#if defined(__CUDA_ARCH__)
  const double want = ceil(__dmul_rn(tp, __ull2double_rn(total)));
#else
  const double want = std::ceil(tp * double(total));
#endif
  uint64_t t = want >= double(total) ? total : uint64_t(want);
  return t < 1 ? 1 : t;
}

// splitmix64's finaliser, a bijection on 64 bits.
DSV4_SAMPLING_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Distinct counters give distinct h for one seed (both steps are bijections).
DSV4_SAMPLING_HD uint64_t sampling_hash(uint64_t seed, uint64_t counter) {
  return mix64(seed ^ mix64(counter + 0x9e3779b97f4a7c15ull));
}
// ⌊h · M / 2^64⌋ ∈ [0, M).
DSV4_SAMPLING_HD uint64_t scale_draw(uint64_t h, uint64_t M) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(h, M);
#else
  return uint64_t((unsigned __int128)h * M >> 64);
#endif
}

// One logit under a row's penalties (vLLM's order: repetition, then frequency × output count, then
// presence), each step an explicitly rounded f32 operation so every backend computes the same
// bits. output_count = 0 for a token that is only in the prompt: repetition alone applies.
DSV4_SAMPLING_HD float penalized_logit(float logit, const PenaltyParams& p, int32_t output_count) {
  if (logit != logit) return logit;  // NaN stays the same NaN: arithmetic would canonicalise it differently per target
  if (p.repetition != 1.0f) logit = logit > 0.0f ? div_rn(logit, p.repetition) : mul_rn(logit, p.repetition);
  if (output_count > 0) {
    logit = sub_rn(logit, mul_rn(p.frequency, float(output_count)));
    logit = sub_rn(logit, p.presence);
  }
  return logit;
}

}  // namespace sampling
}  // namespace dsv4
