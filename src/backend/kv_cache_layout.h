// Byte layout of the paged caches shared by the CPU and CUDA backends (SPEC §4.2), and host
// encode/decode of one entry. Plain C++17 (usable from .cu files); depends only on core/dtypes.h.
//
// Two entry kinds live in pools of fixed-size pages; a pool is one contiguous allocation and a
// global entry id is  g = page · kEntriesPerPage + slot.  Sequences reach their entries through
// block tables (int32 page ids). Window ring entries and compressed entries share the KV format
// and may share one pool or use two (the attention kernel takes one pool pointer for the window
// part of each query's list and one for the compressed part; pass the same pointer twice for a
// single pool).
//
// KV entry (584 bytes = 448 e4m3 "nope" + 64 bf16 RoPE + 7 ue8m0 scales + 1 pad), FlashMLA
// "MODEL1" page layout for a page of B = kEntriesPerPage entries:
//   [0, 576·B)            entry k at 576·k: bytes 0..447 e4m3 nope, 448..575 = 64 bf16 rope
//   [576·B, 576·B + 8·B)  entry k at 576·B + 8·k: 7 scale bytes (ue8m0, one per 64 nope values) + pad
//   page size rounded up to a multiple of 576 bytes (kKvPageBytes)
// Quantiser (SPEC §2.5, the reference's rule, amax floored at 1e-4 before the division):
//   s = 2^ceil(log2(max(amax, 1e-4) · (1/448)))   (ceil from the IEEE bits, core/dtypes.h pow2_ceil)
//   q = e4m3(clamp(x / s, ±448)) round-to-nearest-even;  decoded value = e4m3(q) · s, exact in bf16.
// Encoding raw bf16 KV therefore performs the reference's FP8 simulation, and encoding values that
// are already simulated reproduces them exactly (decode(encode(x)) == fp8_sim(x) in both cases).
//
// Indexer key entry (128 values of the FP4-simulated key, SPEC §2.6):
//   FP4 (default, lossless): 64 bytes packed e2m1 (element 2i in the low nibble of byte i) + 4 ue8m0
//     scales (one per 32 values). Page: [64·B packed][4·B scales], padded to 16 bytes.
//   FP8 (optional, 132 bytes): 128 e4m3 + one f32 power-of-two scale. Page: [128·B e4m3][4·B f32].
//     Lossless for FP4-simulated keys whose four block scales lie within 2^11 of each other.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtypes.h"

#ifdef __CUDACC__
#define DSV4_LAYOUT_FN __host__ __device__ constexpr
#else
#define DSV4_LAYOUT_FN constexpr
#endif

namespace dsv4::kv_layout {

// The one page-size choice of the engine (entries per page, for every pool kind). 64 keeps the
// window ring at two pages and makes one page of CSA entries cover 256 tokens.
inline constexpr int kEntriesPerPage = 64;

// ---- KV entries ---------------------------------------------------------------------------------
inline constexpr int kHeadDim = 512;
inline constexpr int kNopeDim = 448;
inline constexpr int kRopeDim = 64;
inline constexpr int kScaleBlock = 64;                         // nope values per ue8m0 scale
inline constexpr int kNumScales = kNopeDim / kScaleBlock;      // 7
inline constexpr int kEntryDataBytes = kNopeDim + 2 * kRopeDim;  // 576
inline constexpr int kEntryScaleBytes = 8;                     // 7 scales + 1 pad
inline constexpr int kEntryBytes = kEntryDataBytes + kEntryScaleBytes;  // 584
inline constexpr size_t kKvPageBytes =
    (size_t(kEntryBytes) * kEntriesPerPage + kEntryDataBytes - 1) / kEntryDataBytes * kEntryDataBytes;
static_assert(kKvPageBytes % 16 == 0, "pages must stay 16-byte aligned");

// Byte offsets of entry g's data (576 B) and scales (8 B) from the pool base.
DSV4_LAYOUT_FN size_t kv_entry_data_offset(int64_t g) {
  return size_t(g / kEntriesPerPage) * kKvPageBytes + size_t(g % kEntriesPerPage) * kEntryDataBytes;
}
DSV4_LAYOUT_FN size_t kv_entry_scale_offset(int64_t g) {
  return size_t(g / kEntriesPerPage) * kKvPageBytes + size_t(kEntryDataBytes) * kEntriesPerPage +
         size_t(g % kEntriesPerPage) * kEntryScaleBytes;
}
// kv_entry_scale_offset(g) − kv_entry_data_offset(g) for g ≥ 0 (both lie in g's page).
DSV4_LAYOUT_FN int64_t kv_scale_from_data_delta(int64_t g) {
  return int64_t(kEntryDataBytes) * kEntriesPerPage + (g % kEntriesPerPage) * (kEntryScaleBytes - kEntryDataBytes);
}

// ---- Indexer key entries ------------------------------------------------------------------------
inline constexpr int kIndexDim = 128;
inline constexpr int kIndexFp4Block = 32;
inline constexpr int kIndexFp4Scales = kIndexDim / kIndexFp4Block;  // 4
inline constexpr int kIndexFp4DataBytes = kIndexDim / 2;            // 64
inline constexpr int kIndexFp4EntryBytes = kIndexFp4DataBytes + kIndexFp4Scales;  // 68
inline constexpr size_t kIndexFp4PageBytes = (size_t(kIndexFp4EntryBytes) * kEntriesPerPage + 15) / 16 * 16;
inline constexpr int kIndexFp8DataBytes = kIndexDim;                // 128
inline constexpr int kIndexFp8EntryBytes = kIndexFp8DataBytes + 4;  // 132
inline constexpr size_t kIndexFp8PageBytes = (size_t(kIndexFp8EntryBytes) * kEntriesPerPage + 15) / 16 * 16;

DSV4_LAYOUT_FN size_t index_fp4_data_offset(int64_t g) {
  return size_t(g / kEntriesPerPage) * kIndexFp4PageBytes + size_t(g % kEntriesPerPage) * kIndexFp4DataBytes;
}
DSV4_LAYOUT_FN size_t index_fp4_scale_offset(int64_t g) {
  return size_t(g / kEntriesPerPage) * kIndexFp4PageBytes + size_t(kIndexFp4DataBytes) * kEntriesPerPage +
         size_t(g % kEntriesPerPage) * kIndexFp4Scales;
}
DSV4_LAYOUT_FN size_t index_fp8_data_offset(int64_t g) {
  return size_t(g / kEntriesPerPage) * kIndexFp8PageBytes + size_t(g % kEntriesPerPage) * kIndexFp8DataBytes;
}
DSV4_LAYOUT_FN size_t index_fp8_scale_offset(int64_t g) {
  return size_t(g / kEntriesPerPage) * kIndexFp8PageBytes + size_t(kIndexFp8DataBytes) * kEntriesPerPage +
         size_t(g % kEntriesPerPage) * 4;
}

// ---- Host codecs (one entry) --------------------------------------------------------------------

// The FP8 block scale of SPEC §2.5 for a block whose max |x| is `amax`.
inline float kv_fp8_block_scale(float amax) {
  if (!(amax > 1e-4f)) amax = 1e-4f;
  return pow2_ceil(amax * (1.0f / 448.0f));
}

// values: 512 floats (bf16-valued: 448 nope then 64 rope). data: 576 bytes, scales: 8 bytes.
inline void encode_kv_entry(const float* values, uint8_t* data, uint8_t* scales) {
  for (int b = 0; b < kNumScales; ++b) {
    const float* x = values + b * kScaleBlock;
    float amax = 0.f;
    for (int i = 0; i < kScaleBlock; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    float s = kv_fp8_block_scale(amax);
    scales[b] = f32_pow2_to_e8m0(s);
    for (int i = 0; i < kScaleBlock; ++i) {
      float v = x[i] / s;
      v = v > 448.f ? 448.f : (v < -448.f ? -448.f : v);
      data[b * kScaleBlock + i] = f32_to_e4m3(v);
    }
  }
  scales[kNumScales] = 0;
  for (int i = 0; i < kRopeDim; ++i) {
    uint16_t h = f32_to_bf16(values[kNopeDim + i]);
    data[kNopeDim + 2 * i] = uint8_t(h & 0xff);
    data[kNopeDim + 2 * i + 1] = uint8_t(h >> 8);
  }
}
inline void encode_kv_entry(const uint16_t* bf16_values, uint8_t* data, uint8_t* scales) {
  float v[kHeadDim];
  for (int i = 0; i < kHeadDim; ++i) v[i] = bf16_to_f32(bf16_values[i]);
  encode_kv_entry(v, data, scales);
}

// out: 512 floats, each exactly a bf16 value.
inline void decode_kv_entry(const uint8_t* data, const uint8_t* scales, float* out) {
  for (int i = 0; i < kNopeDim; ++i)
    out[i] = e4m3_to_f32(data[i]) * e8m0_to_f32(scales[i / kScaleBlock]);
  for (int i = 0; i < kRopeDim; ++i)
    out[kNopeDim + i] = bf16_to_f32(uint16_t(data[kNopeDim + 2 * i] | (data[kNopeDim + 2 * i + 1] << 8)));
}
inline void decode_kv_entry(const uint8_t* data, const uint8_t* scales, uint16_t* bf16_out) {
  float v[kHeadDim];
  decode_kv_entry(data, scales, v);
  for (int i = 0; i < kHeadDim; ++i) bf16_out[i] = f32_to_bf16(v[i]);
}

// Pool-addressed forms: entry g of a pool whose base is `pool`.
inline void encode_kv_entry_at(uint8_t* pool, int64_t g, const float* values) {
  encode_kv_entry(values, pool + kv_entry_data_offset(g), pool + kv_entry_scale_offset(g));
}
inline void decode_kv_entry_at(const uint8_t* pool, int64_t g, float* out) {
  decode_kv_entry(pool + kv_entry_data_offset(g), pool + kv_entry_scale_offset(g), out);
}

// The FP4 block scale of SPEC §2.6 for a block of 32 whose max |x| is `amax`.
inline float index_fp4_block_scale(float amax) {
  const float floor = 6.0f * bits_to_f32(0x00800000u);  // 6 · 2^-126
  if (!(amax > floor)) amax = floor;
  return pow2_ceil(amax / 6.0f);
}

// values: 128 floats. packed: 64 bytes, scales: 4 bytes. Quantises (= the FP4 simulation).
inline void encode_index_key_fp4(const float* values, uint8_t* packed, uint8_t* scales) {
  for (int b = 0; b < kIndexFp4Scales; ++b) {
    const float* x = values + b * kIndexFp4Block;
    float amax = 0.f;
    for (int i = 0; i < kIndexFp4Block; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    float s = index_fp4_block_scale(amax);
    scales[b] = f32_pow2_to_e8m0(s);
    for (int i = 0; i < kIndexFp4Block; i += 2) {
      auto code = [&](float v) {
        v /= s;
        return f32_to_e2m1(v > 6.f ? 6.f : (v < -6.f ? -6.f : v));
      };
      packed[(b * kIndexFp4Block + i) / 2] = uint8_t(code(x[i]) | (code(x[i + 1]) << 4));
    }
  }
}
inline void decode_index_key_fp4(const uint8_t* packed, const uint8_t* scales, float* out) {
  for (int i = 0; i < kIndexDim; ++i) {
    uint8_t code = (i & 1) ? (packed[i / 2] >> 4) : (packed[i / 2] & 15);
    out[i] = e2m1_to_f32(code) * e8m0_to_f32(scales[i / kIndexFp4Block]);
  }
}

// FP8 form: one power-of-two scale per entry, s = 2^ceil(log2(max(amax, 1e-4)/448)).
inline void encode_index_key_fp8(const float* values, uint8_t* data, float* scale) {
  float amax = 0.f;
  for (int i = 0; i < kIndexDim; ++i) amax = std::fmax(amax, std::fabs(values[i]));
  float s = kv_fp8_block_scale(amax);
  *scale = s;
  for (int i = 0; i < kIndexDim; ++i) {
    float v = values[i] / s;
    data[i] = f32_to_e4m3(v > 448.f ? 448.f : (v < -448.f ? -448.f : v));
  }
}
inline void decode_index_key_fp8(const uint8_t* data, float scale, float* out) {
  for (int i = 0; i < kIndexDim; ++i) out[i] = e4m3_to_f32(data[i]) * scale;
}

inline void encode_index_key_fp4_at(uint8_t* pool, int64_t g, const float* values) {
  encode_index_key_fp4(values, pool + index_fp4_data_offset(g), pool + index_fp4_scale_offset(g));
}
inline void decode_index_key_fp4_at(const uint8_t* pool, int64_t g, float* out) {
  decode_index_key_fp4(pool + index_fp4_data_offset(g), pool + index_fp4_scale_offset(g), out);
}

}  // namespace dsv4::kv_layout
