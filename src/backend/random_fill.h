// Random weight values as a pure function of (stream, element index), so a backend can make a
// tensor where it will live — the CUDA backend in device memory, in parallel, no host copy — and
// the host makes the same bytes (random_fill_reference): model/synthetic's models, on disk or
// generated in place, are one model. splitmix64 per element; each kind says how a random number
// becomes an element.
#pragma once
#include <cstdint>

namespace dsv4 {

struct RandomFill {
  enum class Kind : int32_t {
    Bf16Uniform,  // bf16(mean + amp · u), u uniform in [−1, 1) from 24 bits
    F32Uniform,   // mean + amp · u
    Fp8Weight,    // e4m3 codes of magnitude 2^-2 … 2^1.9, random sign and mantissa (rms ~1.3)
    Bytes,        // every byte value (packed e2m1 pairs)
    Constant,     // `byte` everywhere (block scales)
  };
  Kind kind = Kind::Bytes;
  uint64_t stream = 0;
  float mean = 0, amp = 0;
  uint8_t byte = 0;
  // A window of a larger 2-D tensor (a tensor-parallel rank's slice, made without the rest):
  // element i is element (row0 + i / cols) · source_cols + col0 + i % cols of the whole tensor.
  // cols = 0: the whole tensor (element i is i).
  int64_t cols = 0, source_cols = 0, row0 = 0, col0 = 0;
};

inline constexpr uint64_t kRandomFillIndexMix = 0xd1342543de82ef95ull;

#if defined(__CUDACC__)
#define DSV4_HOST_DEVICE __host__ __device__
#else
#define DSV4_HOST_DEVICE
#endif

// splitmix64: a counter-based generator.
DSV4_HOST_DEVICE inline uint64_t random_mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// The random number of element i of a fill (its index in the whole tensor, RandomFill's window).
DSV4_HOST_DEVICE inline uint64_t random_fill_number(const RandomFill& f, int64_t i) {
  const int64_t whole = f.cols ? (f.row0 + i / f.cols) * f.source_cols + f.col0 + i % f.cols : i;
  return random_mix(f.stream ^ uint64_t(whole) * kRandomFillIndexMix);
}
// Uniform in [−1, 1) from 24 bits (exact in f32).
DSV4_HOST_DEVICE inline float random_unit(uint64_t r) { return float(int32_t(r & 0xffffff) - 0x800000) / float(0x800000); }

// The bytes of a tensor of `n` elements of the fill's kind (bf16: 2 bytes each, f32: 4, else 1),
// on the host, in parallel chunks.
void random_fill_reference(const RandomFill& fill, void* dst, int64_t n);
// Bytes per element of a fill's kind.
int random_fill_element_bytes(RandomFill::Kind kind);

}  // namespace dsv4
