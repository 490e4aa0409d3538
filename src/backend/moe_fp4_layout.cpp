// Load-time repack of FP4 expert weights (MXFP4 and NVFP4, SPEC.md §5.1, §5.3) into the unit layout
// the CUDA kernels read (described in moe_fp4_layout.h), and its inverse for tests.
//
// The kernel turns a nibble into bf16 by bit placement: sign → bit 15, the three exponent/mantissa
// bits → bits 8..6. That bf16 equals e2m1 · 2^-126 for all 16 codes (0.5 becomes the subnormal
// 2^-127). It then multiplies by a bf16 "folded" scale decoded from one stored byte; the product is
// the weight divided by a per-matrix factor that the epilogue multiplies back in f32:
//   MXFP4: byte = bf16 exponent field of 2^(e-127) · 2^126 · 2^-g, i.e. e + 126 - g, with
//          g = max(e_max - 128, -126) per matrix; factor = 2^g. The bf16 weight e2m1 · 2^(e-127-g) is
//          exact for every group whose scale lies within 2^133 of the matrix's largest (always, in real
//          checkpoints); groups further down (relative size < 2^-130) are stored as zeros.
//   NVFP4: the folded scale is f32(e4m3) · 2^118, a normal bf16 with at most 3 mantissa bits, stored
//          as ((exponent field − 224) << 3) | mantissa-bits (five + three bits); factor =
//          weight_scale_2 · 2^8. The bf16 weight e2m1 · e4m3 · 2^-8 (≤ 5 significant bits, within
//          [2^-18, 10.5]) is exact, so value · factor rounds once, exactly like e2m1 · e4m3 · scale_2.
//          Zero scales store zero nibbles.
// Both products fit bf16 exactly, so the kernel's dequantisation loses nothing; the un-repack below
// reproduces dequantize_fp4_matrix() bit for bit (tests check it).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/moe_fp4_layout.h"
#include "core/dtypes.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace dsv4 {
namespace {

constexpr int kNvfp4ExponentBase = 224;  // bf16 exponent field = 224 + stored 5-bit exponent
constexpr int kNvfp4FoldShift = 118;     // folded scale = e4m3 · 2^118
constexpr int kNvfp4FactorShift = 8;     // 2^-126 · 2^118 = 2^-8

// How one source matrix's scale codes become stored bytes.
struct ScaleEncoder {
  MoeFp4Format format;
  int mx_shift = 0;  // g (MXFP4)
  float factor = 1.f;

  // Returns false when the group must be stored as zeros.
  bool encode(uint8_t code, uint8_t* out) const {
    if (format == MoeFp4Format::Mxfp4) {
      int e = code;
      if (e - 128 - mx_shift < -133) { *out = 0; return false; }
      *out = uint8_t(e + 126 - mx_shift);
      return true;
    }
    float v = e4m3_to_f32(code);
    if (v == 0.f) { *out = 0; return false; }
    uint32_t bits = f32_to_bits(std::ldexp(v, kNvfp4FoldShift)) >> 16;
    *out = uint8_t((((bits >> 7) - kNvfp4ExponentBase) << 3) | ((bits >> 4) & 7));
    return true;
  }
};

ScaleEncoder make_encoder(MoeFp4Format format, const uint8_t* scales, size_t count, float scale_2,
                          const char* what, int expert) {
  ScaleEncoder enc{format};
  if (format == MoeFp4Format::Mxfp4) {
    int emax = 0;
    for (size_t i = 0; i < count; ++i) {
      if (scales[i] == 255) fail("expert {} {}: ue8m0 scale 255 (NaN) at index {}", expert, what, i);
      emax = std::max(emax, int(scales[i]));
    }
    enc.mx_shift = std::max(emax - 128, -126);
    enc.factor = std::ldexp(1.f, enc.mx_shift);
  } else {
    for (size_t i = 0; i < count; ++i) {
      uint8_t c = scales[i];
      if ((c & 0x7f) == 0x7f) fail("expert {} {}: e4m3 scale NaN at index {}", expert, what, i);
      if ((c & 0x80) && (c & 0x7f)) fail("expert {} {}: negative e4m3 scale at index {}", expert, what, i);
    }
    if (!std::isfinite(scale_2) || scale_2 <= 0.f || scale_2 > 1e30f)
      fail("expert {} {}: weight_scale_2 {} is not a positive finite scale", expert, what, scale_2);
    enc.factor = std::ldexp(scale_2, kNvfp4FactorShift);
  }
  return enc;
}

// Physical (row within the unit, input within the unit) of lane L's word t, nibble i.
struct UnitPos {
  int row16, col64;
};
inline UnitPos unit_position(int lane, int t, int i) {
  int g = lane >> 2, q = lane & 3, reg = i & 3, hi = i >> 2;
  return {g + 8 * (reg & 1), 16 * q + 4 * t + 2 * (reg >> 1) + hi};
}
// Byte offset inside a unit's scale block of (row16, group within the unit).
inline int unit_scale_offset(MoeFp4Format f, int row16, int group_in_unit) {
  int g = row16 & 7, h = row16 >> 3;
  return f == MoeFp4Format::Nvfp4 ? (4 * g + group_in_unit) * 2 + h : (2 * g + group_in_unit) * 2 + h;
}

// Source of one row of a repacked matrix: packed bytes, scale codes and the encoder of its matrix.
struct SourceRow {
  const uint8_t* packed;
  const uint8_t* scales;
  const ScaleEncoder* enc;
};

// Writes matrix rows [R, K] (R = 16 · row_tiles) given by row(r) into dst / dst_scales.
template <typename RowFn>
void repack_matrix(MoeFp4Format f, int rows, int cols, RowFn row, uint8_t* dst, uint8_t* dst_scales) {
  const int group = moe_fp4_group_size(f), kchunks = cols / kMoeUnitCols, sbytes = moe_unit_scale_bytes(f);
  for (int rt = 0; rt < rows / kMoeUnitRows; ++rt) {
    SourceRow src[kMoeUnitRows];
    for (int r = 0; r < kMoeUnitRows; ++r) src[r] = row(rt * kMoeUnitRows + r);
    for (int kc = 0; kc < kchunks; ++kc) {
      uint8_t* unit = dst + (size_t(rt) * kchunks + kc) * kMoeUnitBytes;
      uint8_t* uscale = dst_scales + (size_t(rt) * kchunks + kc) * sbytes;
      std::memset(unit, 0, kMoeUnitBytes);
      bool keep_group[kMoeUnitRows][kMoeUnitCols / 16];
      for (int r = 0; r < kMoeUnitRows; ++r)
        for (int gi = 0; gi < kMoeUnitCols / group; ++gi) {
          uint8_t code = src[r].scales[size_t(kc) * (kMoeUnitCols / group) + gi];
          keep_group[r][gi] = src[r].enc->encode(code, &uscale[unit_scale_offset(f, r, gi)]);
        }
      for (int lane = 0; lane < 32; ++lane)
        for (int t = 0; t < 4; ++t)
          for (int i = 0; i < 8; ++i) {
            UnitPos p = unit_position(lane, t, i);
            if (!keep_group[p.row16][p.col64 / group]) continue;
            int col = kc * kMoeUnitCols + p.col64;
            uint8_t b = src[p.row16].packed[col / 2];
            uint8_t nib = (col & 1) ? uint8_t(b >> 4) : uint8_t(b & 15);
            unit[lane * 16 + t * 4 + i / 2] |= uint8_t(nib << (4 * (i & 1)));
          }
    }
  }
}

// Visits every nibble of a unit-layout matrix [rows, cols] with its group's byte (scale code or W4A8
// table index): fn(row, col, nibble, group byte).
template <typename Fn>
void for_each_nibble(MoeFp4Format f, int rows, int cols, const uint8_t* src, const uint8_t* group_bytes, Fn fn) {
  const int group = moe_fp4_group_size(f), kchunks = cols / kMoeUnitCols, sbytes = moe_unit_scale_bytes(f);
  for (int rt = 0; rt < rows / kMoeUnitRows; ++rt)
    for (int kc = 0; kc < kchunks; ++kc) {
      const uint8_t* unit = src + (size_t(rt) * kchunks + kc) * kMoeUnitBytes;
      const uint8_t* ugroup = group_bytes + (size_t(rt) * kchunks + kc) * sbytes;
      for (int lane = 0; lane < 32; ++lane)
        for (int t = 0; t < 4; ++t)
          for (int i = 0; i < 8; ++i) {
            UnitPos p = unit_position(lane, t, i);
            uint8_t nib = (unit[lane * 16 + t * 4 + i / 2] >> (4 * (i & 1))) & 15;
            fn(rt * kMoeUnitRows + p.row16, kc * kMoeUnitCols + p.col64, nib,
               ugroup[unit_scale_offset(f, p.row16, p.col64 / group)]);
          }
    }
}

// Inverse of repack_matrix for one matrix: place(row, col, value) with value = the repacked weight as
// the kernel computes it (before the matrix factor).
template <typename PlaceFn>
void unrepack_matrix(MoeFp4Format f, int rows, int cols, const uint8_t* src, const uint8_t* src_scales,
                     PlaceFn place) {
  for_each_nibble(f, rows, cols, src, src_scales, [&](int r, int c, uint8_t nib, uint8_t sb) {
    uint32_t sbits = f == MoeFp4Format::Mxfp4 ? uint32_t(sb) << 7 : (uint32_t(sb) << 4) + (kNvfp4ExponentBase << 7);
    // The kernel's arithmetic: bf16(nibble bits) · bf16(scale bits) · factor.
    uint32_t wbits = (uint32_t(nib & 7) << 6) | (uint32_t(nib & 8) << 12);
    place(r, c, double(bf16_to_f32(uint16_t(wbits))) * double(bf16_to_f32(uint16_t(sbits))));
  });
}

// W4A8 table index bytes (unit-scale layout) and row factors of one MXFP4 matrix [rows, cols] whose
// unit-order row r has ue8m0 codes row_codes(r); see moe_fp4_layout.h. Returns the groups not exact in e4m3.
template <typename CodesFn, typename RowScaleFn>
size_t w4a8_index_matrix(int rows, int cols, CodesFn row_codes, RowScaleFn set_row_scale, uint8_t* dst) {
  constexpr MoeFp4Format f = MoeFp4Format::Mxfp4;
  const int group = moe_fp4_group_size(f), groups = cols / group, kchunks = cols / kMoeUnitCols;
  const int per_unit = kMoeUnitCols / group, sbytes = moe_unit_scale_bytes(f);
  size_t rounded = 0;
  for (int r = 0; r < rows; ++r) {
    const uint8_t* codes = row_codes(r);
    const int emax = *std::max_element(codes, codes + groups);
    set_row_scale(r, std::ldexp(1.f, emax - 127 - kW4a8MaxShift));
    for (int gi = 0; gi < groups; ++gi) {
      const int d = int(codes[gi]) - emax + kW4a8MaxShift;
      if (d < -8) ++rounded;
      const int index = std::max(d, kW4a8MinShift) - kW4a8MinShift;
      dst[(size_t(r / kMoeUnitRows) * kchunks + gi / per_unit) * sbytes +
          unit_scale_offset(f, r % kMoeUnitRows, gi % per_unit)] = uint8_t(index);
    }
  }
  return rounded;
}

}  // namespace

uint8_t moe_w4a8_table_entry(int table, int code) {
  return f32_to_e4m3(std::ldexp(e2m1_to_f32(uint8_t(code & 7)), table + kW4a8MinShift));
}

MoeFp4Repacked moe_fp4_repack(const MoeFp4Shape& shape, const std::vector<MoeFp4ExpertTensors>& experts) {
  const int E = shape.experts, D = shape.hidden, I = shape.inter;
  const MoeFp4Format f = shape.format;
  if (E <= 0 || D <= 0 || I <= 0 || D % 128 || I % 128)
    fail("moe_fp4_repack: hidden {} and inter {} must be positive multiples of 128 (experts {})", D, I, E);
  if (E > 1024) fail("moe_fp4_repack: {} experts (at most 1024 supported by the routing kernel)", E);
  if (int(experts.size()) != E) fail("moe_fp4_repack: {} expert tensors given for {} experts", experts.size(), E);
  const int group = moe_fp4_group_size(f), sbytes = moe_unit_scale_bytes(f);
  const size_t gu_units = size_t(2 * I / kMoeUnitRows) * (D / kMoeUnitCols);
  const size_t dn_units = size_t(D / kMoeUnitRows) * (I / kMoeUnitCols);
  MoeFp4Repacked out;
  out.shape = shape;
  out.gate_up.resize(E * gu_units * kMoeUnitBytes);
  out.gate_up_scales.resize(E * gu_units * sbytes);
  out.down.resize(E * dn_units * kMoeUnitBytes);
  out.down_scales.resize(E * dn_units * sbytes);
  out.factors.resize(size_t(E) * kFactorsPerExpert);
  const bool w4a8 = f == MoeFp4Format::Mxfp4;
  std::vector<size_t> rounded(E, 0);
  if (w4a8) {
    out.w4a8_gate_up_index.resize(E * gu_units * sbytes);
    out.w4a8_down_index.resize(E * dn_units * sbytes);
    out.w4a8_gate_up_row_scale.resize(size_t(E) * I * 2);
    out.w4a8_down_row_scale.resize(size_t(E) * D);
  }
  parallel_for(E, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      const MoeFp4ExpertTensors& t = experts[e];
      if (!t.w1 || !t.w1_scale || !t.w3 || !t.w3_scale || !t.w2 || !t.w2_scale)
        fail("moe_fp4_repack: expert {} has a missing tensor", e);
      ScaleEncoder e1 = make_encoder(f, t.w1_scale, size_t(I) * (D / group), t.w1_scale_2, "w1", int(e));
      ScaleEncoder e3 = make_encoder(f, t.w3_scale, size_t(I) * (D / group), t.w3_scale_2, "w3", int(e));
      ScaleEncoder e2 = make_encoder(f, t.w2_scale, size_t(D) * (I / group), t.w2_scale_2, "w2", int(e));
      out.factors[e * kFactorsPerExpert + kGateFactor] = e1.factor;
      out.factors[e * kFactorsPerExpert + kUpFactor] = e3.factor;
      out.factors[e * kFactorsPerExpert + kDownFactor] = e2.factor;
      // Gate-up row r: tile r/16, rows 0..7 of a tile are w1, rows 8..15 are w3.
      auto gate_up_row = [&](int r) {
        int rt = r / 16, r16 = r % 16, src = rt * 8 + (r16 & 7);
        return r16 < 8 ? SourceRow{t.w1 + size_t(src) * (D / 2), t.w1_scale + size_t(src) * (D / group), &e1}
                       : SourceRow{t.w3 + size_t(src) * (D / 2), t.w3_scale + size_t(src) * (D / group), &e3};
      };
      auto down_row = [&](int r) {
        return SourceRow{t.w2 + size_t(r) * (I / 2), t.w2_scale + size_t(r) * (I / group), &e2};
      };
      repack_matrix(f, 2 * I, D, gate_up_row, &out.gate_up[e * gu_units * kMoeUnitBytes],
                    &out.gate_up_scales[e * gu_units * sbytes]);
      repack_matrix(f, D, I, down_row, &out.down[e * dn_units * kMoeUnitBytes], &out.down_scales[e * dn_units * sbytes]);
      if (!w4a8) continue;
      float* gu_scale = &out.w4a8_gate_up_row_scale[size_t(e) * I * 2];
      float* dn_scale = &out.w4a8_down_row_scale[size_t(e) * D];
      rounded[e] = w4a8_index_matrix(
                       2 * I, D, [&](int r) { return gate_up_row(r).scales; },
                       [&](int r, float v) { gu_scale[2 * (r / 16 * 8 + r % 8) + (r % 16) / 8] = v; },
                       &out.w4a8_gate_up_index[e * gu_units * sbytes]) +
                   w4a8_index_matrix(
                       D, I, [&](int r) { return down_row(r).scales; }, [&](int r, float v) { dn_scale[r] = v; },
                       &out.w4a8_down_index[e * dn_units * sbytes]);
    }
  });
  for (size_t r : rounded) out.w4a8_rounded_groups += r;
  return out;
}

MoeFp4ExpertF32 moe_fp4_unrepack(const MoeFp4Repacked& rp, int e) {
  const int D = rp.shape.hidden, I = rp.shape.inter;
  const MoeFp4Format f = rp.shape.format;
  const int sbytes = moe_unit_scale_bytes(f);
  const size_t gu_units = size_t(2 * I / kMoeUnitRows) * (D / kMoeUnitCols);
  const size_t dn_units = size_t(D / kMoeUnitRows) * (I / kMoeUnitCols);
  const float* fac = &rp.factors[size_t(e) * kFactorsPerExpert];
  MoeFp4ExpertF32 w;
  w.w1.resize(size_t(I) * D);
  w.w3.resize(size_t(I) * D);
  w.w2.resize(size_t(D) * I);
  unrepack_matrix(f, 2 * I, D, &rp.gate_up[e * gu_units * kMoeUnitBytes], &rp.gate_up_scales[e * gu_units * sbytes],
                  [&](int r, int c, double v) {
                    int rt = r / 16, r16 = r % 16, src = rt * 8 + (r16 & 7);
                    if (r16 < 8) w.w1[size_t(src) * D + c] = float(v * fac[kGateFactor]);
                    else w.w3[size_t(src) * D + c] = float(v * fac[kUpFactor]);
                  });
  unrepack_matrix(f, D, I, &rp.down[e * dn_units * kMoeUnitBytes], &rp.down_scales[e * dn_units * sbytes],
                  [&](int r, int c, double v) { w.w2[size_t(r) * I + c] = float(v * fac[kDownFactor]); });
  return w;
}

MoeFp4ExpertF32 moe_fp4_unrepack_w4a8(const MoeFp4Repacked& rp, int e) {
  const int D = rp.shape.hidden, I = rp.shape.inter;
  constexpr MoeFp4Format f = MoeFp4Format::Mxfp4;
  if (rp.shape.format != f || rp.w4a8_gate_up_index.empty()) fail("moe_fp4_unrepack_w4a8: no W4A8 form (NVFP4)");
  const int sbytes = moe_unit_scale_bytes(f);
  const size_t gu_units = size_t(2 * I / kMoeUnitRows) * (D / kMoeUnitCols);
  const size_t dn_units = size_t(D / kMoeUnitRows) * (I / kMoeUnitCols);
  // The kernel's arithmetic: table entry (e4m3) with the nibble's sign, times the row factor.
  auto unpack = [&](int rows, int cols, const uint8_t* src, const uint8_t* index, auto place) {
    for_each_nibble(f, rows, cols, src, index, [&](int r, int c, uint8_t nib, uint8_t table) {
      float v = e4m3_to_f32(moe_w4a8_table_entry(table, nib & 7));
      place(r, c, (nib & 8) ? -v : v);
    });
  };
  const float* gu_scale = &rp.w4a8_gate_up_row_scale[size_t(e) * I * 2];
  const float* dn_scale = &rp.w4a8_down_row_scale[size_t(e) * D];
  MoeFp4ExpertF32 w;
  w.w1.resize(size_t(I) * D);
  w.w3.resize(size_t(I) * D);
  w.w2.resize(size_t(D) * I);
  unpack(2 * I, D, &rp.gate_up[e * gu_units * kMoeUnitBytes], &rp.w4a8_gate_up_index[e * gu_units * sbytes],
         [&](int r, int c, float v) {
           int ch = r / 16 * 8 + r % 8, up = (r % 16) / 8;
           (up ? w.w3 : w.w1)[size_t(ch) * D + c] = v * gu_scale[2 * ch + up];
         });
  unpack(D, I, &rp.down[e * dn_units * kMoeUnitBytes], &rp.w4a8_down_index[e * dn_units * sbytes],
         [&](int r, int c, float v) { w.w2[size_t(r) * I + c] = v * dn_scale[r]; });
  return w;
}

}  // namespace dsv4
