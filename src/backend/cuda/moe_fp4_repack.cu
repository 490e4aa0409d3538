// Load-time repack of FP4 routed experts on the GPU (moe_fp4_repack.h): the same function as the CPU
// twin moe_fp4_repack (backend/moe_fp4_layout.cpp, which states the layout, the scale encodings and
// why they are exact), computed with the same integer and power-of-two f32 arithmetic, so every
// output byte is the CPU's.
#include <algorithm>
#include <cstring>

#include "backend/cuda/moe_fp4.h"
#include "backend/cuda/moe_fp4_kernels.cuh"
#include "backend/cuda/moe_fp4_repack.h"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

constexpr int kRepackThreads = 256;
constexpr int kRepackWarps = kRepackThreads / 32;
constexpr int kChunksPerPass = 2;  // K chunks a warp loads before it writes (loads in flight)

// The first invalid scale as one key, so atomicMin keeps the one a sequential scan meets first:
// expert (bits 45..), matrix (w1, w3, w2: bits 43–44), index of the code (bits 3–42), kind (bits 0–2).
// weight_scale_2 is checked after its matrix's codes (index all ones).
enum RepackError : unsigned { kUe8m0Nan = 1, kE4m3Nan = 2, kE4m3Negative = 3, kBadScale2 = 4 };
constexpr int kKeyIndexBits = 40;
constexpr unsigned long long kKeyIndexMask = (1ull << kKeyIndexBits) - 1;
constexpr unsigned long long kNoError = ~0ull;

__host__ __device__ constexpr unsigned long long error_key(int expert, int matrix, unsigned long long index,
                                                           unsigned kind) {
  return (static_cast<unsigned long long>(expert) << (kKeyIndexBits + 5)) |
         (static_cast<unsigned long long>(matrix) << (kKeyIndexBits + 3)) | ((index & kKeyIndexMask) << 3) | kind;
}

struct RepackArgs {
  // The staged experts (MoeFp4Staging): matrix m of staged expert j at packed[m] + j · matrix_bytes.
  const uint8_t* packed[3];
  const uint8_t* scales[3];
  const float* scale_2;  // [staged expert][3]
  size_t matrix_bytes, scale_bytes;
  int hidden, inter;
  int expert_begin;  // layer index of staged expert 0
  // MoeFp4Weights of the whole layer.
  uint8_t* gate_up;
  uint8_t* gate_up_scales;
  uint8_t* down;
  uint8_t* down_scales;
  float* factors;
  uint8_t* w4a8_gate_up_index;  // MXFP4 only
  uint8_t* w4a8_down_index;
  float* w4a8_gate_up_row_scale;
  float* w4a8_down_row_scale;
  unsigned long long* status;  // [0] first error key, [1] rounded W4A8 groups
};

// 2^x as f32 for x in [-149, 127], from the bits (normal or subnormal; std::ldexp(1.f, x) exactly).
__device__ __forceinline__ float pow2f(int x) {
  return x >= -126 ? __uint_as_float(uint32_t(x + 127) << 23) : __uint_as_float(1u << (x + 149));
}

// e4m3 code → f32, as core/dtypes.h e4m3_to_f32 for every code but NaN (rejected by the scan).
__device__ __forceinline__ float e4m3_value(uint32_t c) {
  const uint32_t e = (c >> 3) & 15, m = c & 7;
  const float mag = e ? __uint_as_float(((e + 120) << 23) | (m << 20)) : float(m) * 0x1p-9f;
  return (c & 0x80) ? -mag : mag;
}

// The CPU's ScaleEncoder::encode: the stored byte of a scale code; false when the group is stored as
// zeros. `shift` is the MXFP4 matrix shift g (unused for NVFP4).
template <MoeFp4Format F>
__device__ __forceinline__ bool encode_scale(uint32_t code, int shift, uint32_t& byte) {
  if (F == MoeFp4Format::Mxfp4) {
    if (int(code) - 128 - shift < -133) { byte = 0; return false; }
    byte = uint32_t(int(code) + 126 - shift) & 0xff;
    return true;
  }
  const float v = e4m3_value(code);
  if (v == 0.f) { byte = 0; return false; }
  const uint32_t bits = __float_as_uint(v * 0x1p118f) >> 16;  // exact: a power-of-two scaling of a normal
  byte = ((((bits >> 7) - 224u) << 3) | ((bits >> 4) & 7)) & 0xff;
  return true;
}

template <MoeFp4Format F>
__device__ __forceinline__ unsigned code_error(uint32_t c) {
  if (F == MoeFp4Format::Mxfp4) return c == 255 ? kUe8m0Nan : 0;
  if ((c & 0x7f) == 0x7f) return kE4m3Nan;
  if ((c & 0x80) && (c & 0x7f)) return kE4m3Negative;
  return 0;
}

// Per byte of a word of four codes: 0xff where the code is invalid.
template <MoeFp4Format F>
__device__ __forceinline__ uint32_t invalid_codes(uint32_t w) {
  if (F == MoeFp4Format::Mxfp4) return __vcmpeq4(w, 0xffffffffu);
  const uint32_t mag = w & 0x7f7f7f7fu;
  return __vcmpeq4(mag, 0x7f7f7f7fu) | (__vcmpne4(mag, 0u) & __vcmpne4(w & 0x80808080u, 0u));
}

// One block per (matrix, staged expert): validates the matrix's scale codes and weight_scale_2 and
// writes its factor (the CPU's make_encoder). The three matrices hold the same number of codes.
template <MoeFp4Format F>
__global__ void __launch_bounds__(kRepackThreads) moe_fp4_scan_scales_kernel(RepackArgs a) {
  const int matrix = blockIdx.x, staged = blockIdx.y, expert = a.expert_begin + staged;
  const uint4* codes = reinterpret_cast<const uint4*>(a.scales[matrix] + size_t(staged) * a.scale_bytes);
  const size_t vectors = a.scale_bytes / 16;
  uint32_t max4 = 0;  // MXFP4: per-byte maximum over this thread's codes
  bool reported = false;
  for (size_t i = threadIdx.x; i < vectors; i += kRepackThreads) {
    const uint4 v = __ldg(codes + i);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t invalid = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (F == MoeFp4Format::Mxfp4) max4 = __vmaxu4(max4, w[j]);
      invalid |= invalid_codes<F>(w[j]);
    }
    if (invalid && !reported) {  // this thread's lowest invalid index: the first one of its first flagged vector
      reported = true;
      unsigned long long key = kNoError;
#pragma unroll
      for (int j = 3; j >= 0; --j)
#pragma unroll
        for (int b = 3; b >= 0; --b)
          if (const unsigned kind = code_error<F>((w[j] >> (8 * b)) & 0xff))
            key = error_key(expert, matrix, i * 16 + 4 * j + b, kind);
      atomicMin(&a.status[0], key);
    }
  }
  __shared__ uint32_t warp_max[kRepackWarps];
  if (F == MoeFp4Format::Mxfp4) {
    uint32_t m = max(max(max4 & 0xff, (max4 >> 8) & 0xff), max((max4 >> 16) & 0xff, max4 >> 24));
    m = __reduce_max_sync(0xffffffffu, m);
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  float factor;
  if (F == MoeFp4Format::Mxfp4) {
    uint32_t emax = 0;
    for (int w = 0; w < kRepackWarps; ++w) emax = max(emax, warp_max[w]);
    factor = pow2f(max(int(emax) - 128, -126));  // 2^g
  } else {
    const float s2 = a.scale_2[staged * 3 + matrix];
    if (!(s2 > 0.f && s2 <= 1e30f)) atomicMin(&a.status[0], error_key(expert, matrix, kKeyIndexMask, kBadScale2));
    factor = s2 * 256.f;  // std::ldexp(scale_2, 8): exact (no -ftz in this library)
  }
  a.factors[size_t(expert) * kFactorsPerExpert + matrix] = factor;
}

// Four e2m1 codes of row g (bytes a0, a1 of a16) and of row g + 8 (b16) → one word of the unit layout:
// nibble i holds row g + 8·(i & 1) at input 2·((i >> 1) & 1) + (i >> 2) of the four (moe_fp4_layout.h).
__device__ __forceinline__ uint32_t unit_word(uint32_t a16, uint32_t b16) {
  auto spread = [](uint32_t x) { return (x & 0x0f0fu) | ((x & 0xf0f0u) << 12); };
  return spread(a16) | (spread(b16) << 4);
}

// One block per 16-row tile of one staged expert's gate-up (tiles 0 .. 2I/16 − 1) or down matrix.
// Unit row r of a gate-up tile rt is w1 row 8·rt + r (r < 8) or w3 row 8·rt + r − 8; of a down tile w2
// row 16·rt + r. Lane 4g + q of a warp writes unit bytes 16·lane .. +15 from the 16 inputs
// 16q .. 16q + 15 of unit rows g and g + 8: one scale group per row, 8 source bytes per row.
template <MoeFp4Format F>
__global__ void __launch_bounds__(kRepackThreads) moe_fp4_repack_units_kernel(RepackArgs a) {
  constexpr bool kMx = F == MoeFp4Format::Mxfp4;
  constexpr int G = moe_fp4_group_size(F), SB = moe_unit_scale_bytes(F), kGroupsPerUnit = kMoeUnitCols / G;
  const int staged = blockIdx.y, expert = a.expert_begin + staged;
  const int gu_tiles = 2 * a.inter / kMoeUnitRows;
  const bool gate_up = int(blockIdx.x) < gu_tiles;
  const int rt = gate_up ? int(blockIdx.x) : int(blockIdx.x) - gu_tiles;
  const int K = gate_up ? a.hidden : a.inter, kchunks = K / kMoeUnitCols, groups = K / G;
  const int rows = gate_up ? 2 * a.inter : a.hidden;
  const size_t unit0 = size_t(expert) * (rows / kMoeUnitRows) * kchunks + size_t(rt) * kchunks;
  uint8_t* const units = (gate_up ? a.gate_up : a.down) + unit0 * kMoeUnitBytes;
  uint8_t* const unit_scales = (gate_up ? a.gate_up_scales : a.down_scales) + unit0 * SB;
  // Source matrix and row of unit row r.
  auto source = [&](int r, int& matrix, int& row) {
    matrix = gate_up ? (r < 8 ? 0 : 1) : 2;
    row = gate_up ? 8 * rt + (r & 7) : 16 * rt + r;
  };
  auto row_codes = [&](int r) {
    int matrix, row;
    source(r, matrix, row);
    return a.scales[matrix] + size_t(staged) * a.scale_bytes + size_t(row) * groups;
  };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, q = lane & 3;

  // W4A8 (MXFP4): each unit row's largest code, and its row factor 2^(emax − 127 − kW4a8MaxShift).
  __shared__ uint32_t row_emax[kMoeUnitRows];
  if (kMx) {
    for (int r = warp; r < kMoeUnitRows; r += kRepackWarps) {
      const uint8_t* codes = row_codes(r);
      uint32_t m = 0;
      for (int i = lane; i < groups; i += 32) m = max(m, uint32_t(codes[i]));
      m = __reduce_max_sync(0xffffffffu, m);
      if (lane == 0) row_emax[r] = m;
    }
    __syncthreads();
    if (threadIdx.x < kMoeUnitRows) {
      const int r = threadIdx.x;
      const float scale = pow2f(int(row_emax[r]) - 127 - kW4a8MaxShift);
      if (gate_up) a.w4a8_gate_up_row_scale[size_t(expert) * 2 * a.inter + 16 * rt + 2 * (r & 7) + (r >> 3)] = scale;
      else a.w4a8_down_row_scale[size_t(expert) * a.hidden + 16 * rt + r] = scale;
    }
  }

  int matrix_a, row_a, matrix_b, row_b;
  source(g, matrix_a, row_a);
  source(g + 8, matrix_b, row_b);
  const size_t packed_offset = size_t(staged) * a.matrix_bytes + 8 * q;
  const uint8_t* const packed_a = a.packed[matrix_a] + packed_offset + size_t(row_a) * (K / 2);
  const uint8_t* const packed_b = a.packed[matrix_b] + packed_offset + size_t(row_b) * (K / 2);
  const int group_in_unit = q / (4 / kGroupsPerUnit);  // NVFP4: q; MXFP4: q / 2
  const uint8_t* const codes_a = row_codes(g) + group_in_unit;
  const uint8_t* const codes_b = row_codes(g + 8) + group_in_unit;
  // The matrix shift g of MXFP4 from the factor 2^g the scan wrote (a normal power of two).
  auto shift_of = [&](int matrix) {
    return kMx ? int((__float_as_uint(a.factors[size_t(expert) * kFactorsPerExpert + matrix]) >> 23) & 0xff) - 127
               : 0;
  };
  const int shift_a = shift_of(matrix_a), shift_b = shift_of(matrix_b);
  const int emax_a = kMx ? int(row_emax[g]) : 0, emax_b = kMx ? int(row_emax[g + 8]) : 0;
  // MXFP4: lanes q and q + 1 share their groups; the even one writes the group bytes.
  const bool writes_groups = kMx ? (q & 1) == 0 : true;
  const int group_byte = kMx ? lane : 2 * lane;  // (2g + q/2)·2 resp. (4g + q)·2: rows g, g + 8 side by side
  uint8_t* const index_base =
      kMx ? (gate_up ? a.w4a8_gate_up_index : a.w4a8_down_index) + unit0 * SB : nullptr;
  unsigned rounded = 0;

  for (int kc0 = warp; kc0 < kchunks; kc0 += kChunksPerPass * kRepackWarps) {
    uint2 wa[kChunksPerPass], wb[kChunksPerPass];
    uint32_t ca[kChunksPerPass], cb[kChunksPerPass];
#pragma unroll
    for (int u = 0; u < kChunksPerPass; ++u) {
      const int kc = kc0 + u * kRepackWarps;
      wa[u] = wb[u] = make_uint2(0, 0);
      ca[u] = cb[u] = 0;
      if (kc < kchunks) {
        wa[u] = __ldg(reinterpret_cast<const uint2*>(packed_a + kc * (kMoeUnitCols / 2)));
        wb[u] = __ldg(reinterpret_cast<const uint2*>(packed_b + kc * (kMoeUnitCols / 2)));
        ca[u] = __ldg(codes_a + kc * kGroupsPerUnit);
        cb[u] = __ldg(codes_b + kc * kGroupsPerUnit);
      }
    }
#pragma unroll
    for (int u = 0; u < kChunksPerPass; ++u) {
      const int kc = kc0 + u * kRepackWarps;
      if (kc >= kchunks) continue;
      uint32_t byte_a, byte_b;
      if (!encode_scale<F>(ca[u], shift_a, byte_a)) wa[u] = make_uint2(0, 0);
      if (!encode_scale<F>(cb[u], shift_b, byte_b)) wb[u] = make_uint2(0, 0);
      const uint4 word = make_uint4(unit_word(wa[u].x & 0xffff, wb[u].x & 0xffff), unit_word(wa[u].x >> 16, wb[u].x >> 16),
                                    unit_word(wa[u].y & 0xffff, wb[u].y & 0xffff), unit_word(wa[u].y >> 16, wb[u].y >> 16));
      *reinterpret_cast<uint4*>(units + size_t(kc) * kMoeUnitBytes + 16 * lane) = word;
      if (writes_groups)
        *reinterpret_cast<uint16_t*>(unit_scales + size_t(kc) * SB + group_byte) = uint16_t(byte_a | (byte_b << 8));
      if (kMx) {
        // The CPU's w4a8_index_matrix: table index max(d, kW4a8MinShift) − kW4a8MinShift of the shift d.
        const int d_a = int(ca[u]) - emax_a + kW4a8MaxShift, d_b = int(cb[u]) - emax_b + kW4a8MaxShift;
        const uint32_t index_a = uint32_t(max(d_a, kW4a8MinShift) - kW4a8MinShift);
        const uint32_t index_b = uint32_t(max(d_b, kW4a8MinShift) - kW4a8MinShift);
        if (writes_groups) {
          *reinterpret_cast<uint16_t*>(index_base + size_t(kc) * SB + group_byte) = uint16_t(index_a | (index_b << 8));
          rounded += unsigned(d_a < -8) + unsigned(d_b < -8);
        }
      }
    }
  }
  if (kMx) {
    rounded = __reduce_add_sync(0xffffffffu, rounded);
    if (lane == 0 && rounded) atomicAdd(&a.status[1], static_cast<unsigned long long>(rounded));
  }
}

template <MoeFp4Format F>
void launch_repack(const RepackArgs& args, int staged, int tile_count, cudaStream_t stream) {
  moe_fp4_scan_scales_kernel<F><<<dim3(3, staged), kRepackThreads, 0, stream>>>(args);
  DSV4_CUDA_CHECK_LAUNCH();
  moe_fp4_repack_units_kernel<F><<<dim3(tile_count, staged), kRepackThreads, 0, stream>>>(args);
  DSV4_CUDA_CHECK_LAUNCH();
}

const char* const kMatrixNames[3] = {"w1", "w3", "w2"};

}  // namespace

MoeFp4Staging::MoeFp4Staging(const MoeFp4Shape& shape, int capacity)
    : shape_(shape),
      capacity_(capacity),
      matrix_bytes_(size_t(shape.inter) * shape.hidden / 2),
      scale_bytes_(size_t(shape.inter) * shape.hidden / moe_fp4_group_size(shape.format)) {
  if (capacity <= 0) fail("MoeFp4Staging: capacity {} experts", capacity);
  buffer_ = DeviceBuffer<uint8_t>(size_t(capacity) * bytes_per_expert(shape));
}

size_t MoeFp4Staging::bytes_per_expert(const MoeFp4Shape& shape) {
  const size_t cells = size_t(shape.inter) * shape.hidden;
  return 3 * (cells / 2 + cells / moe_fp4_group_size(shape.format) + sizeof(float));
}

void MoeFp4Staging::upload(const std::vector<MoeFp4ExpertTensors>& experts, int begin, int count,
                           cudaStream_t stream) {
  if (begin < 0 || count < 0 || count > capacity_ || size_t(begin) + count > experts.size())
    fail("MoeFp4Staging: experts [{}, {}) of {} do not fit a staging of {}", begin, begin + count, experts.size(),
         capacity_);
  std::vector<float> scale_2(size_t(count) * 3);
  for (int j = 0; j < count; ++j) {
    const MoeFp4ExpertTensors& t = experts[size_t(begin) + j];
    const uint8_t* src_packed[3] = {t.w1, t.w3, t.w2};
    const uint8_t* src_scales[3] = {t.w1_scale, t.w3_scale, t.w2_scale};
    for (int m = 0; m < 3; ++m) {
      if (!src_packed[m] || !src_scales[m]) fail("moe_fp4_repack: expert {} has a missing tensor", begin + j);
      // Default: host bytes of a checkpoint, or device bytes of a weight generated in place.
      DSV4_CUDA_CHECK(cudaMemcpyAsync(packed(m) + size_t(j) * matrix_bytes_, src_packed[m], matrix_bytes_,
                                      cudaMemcpyDefault, stream));
      DSV4_CUDA_CHECK(cudaMemcpyAsync(scales(m) + size_t(j) * scale_bytes_, src_scales[m], scale_bytes_,
                                      cudaMemcpyDefault, stream));
    }
    scale_2[size_t(j) * 3 + 0] = t.w1_scale_2;
    scale_2[size_t(j) * 3 + 1] = t.w3_scale_2;
    scale_2[size_t(j) * 3 + 2] = t.w2_scale_2;
  }
  // A pageable source is staged by the driver before the call returns: the vector may go.
  if (count)
    DSV4_CUDA_CHECK(cudaMemcpyAsync(this->scale_2(), scale_2.data(), scale_2.size() * sizeof(float),
                                    cudaMemcpyHostToDevice, stream));
  set_staged(begin, count);
}

void MoeFp4Staging::set_staged(int begin, int count) {
  if (begin < 0 || count < 0 || count > capacity_ || begin + count > shape_.experts)
    fail("MoeFp4Staging: experts [{}, {}) of {} do not fit a staging of {}", begin, begin + count, shape_.experts,
         capacity_);
  begin_ = begin;
  count_ = count;
}

MoeFp4RepackStatus::MoeFp4RepackStatus() : words_(2) {}

void MoeFp4RepackStatus::reset(cudaStream_t stream) {
  static_assert(kNoError == ~0ull, "no error = all bytes 0xff");
  DSV4_CUDA_CHECK(cudaMemsetAsync(words_.get(), 0xff, sizeof(unsigned long long), stream));
  DSV4_CUDA_CHECK(cudaMemsetAsync(words_.get() + 1, 0, sizeof(unsigned long long), stream));
}

size_t MoeFp4RepackStatus::check(const std::vector<MoeFp4ExpertTensors>& experts, cudaStream_t stream) const {
  unsigned long long words[2] = {};
  DSV4_CUDA_CHECK(cudaMemcpyAsync(words, words_.get(), sizeof(words), cudaMemcpyDeviceToHost, stream));
  DSV4_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (words[0] != kNoError) {
    const unsigned kind = unsigned(words[0] & 7);
    const unsigned long long index = (words[0] >> 3) & kKeyIndexMask;
    const int matrix = int((words[0] >> (kKeyIndexBits + 3)) & 3);
    const int expert = int(words[0] >> (kKeyIndexBits + 5));
    const char* what = kMatrixNames[matrix];
    switch (kind) {
      case kUe8m0Nan: fail("expert {} {}: ue8m0 scale 255 (NaN) at index {}", expert, what, index);
      case kE4m3Nan: fail("expert {} {}: e4m3 scale NaN at index {}", expert, what, index);
      case kE4m3Negative: fail("expert {} {}: negative e4m3 scale at index {}", expert, what, index);
      default: {
        const MoeFp4ExpertTensors& t = experts.at(size_t(expert));
        const float s2 = matrix == 0 ? t.w1_scale_2 : matrix == 1 ? t.w3_scale_2 : t.w2_scale_2;
        fail("expert {} {}: weight_scale_2 {} is not a positive finite scale", expert, what, s2);
      }
    }
  }
  return size_t(words[1]);
}

void moe_fp4_repack_enqueue(const MoeFp4Staging& staged, MoeFp4Weights& out, MoeFp4RepackStatus& status,
                            cudaStream_t stream) {
  const MoeFp4Shape& s = staged.shape();
  const MoeFp4Shape& o = out.shape();
  if (s.format != o.format || s.experts != o.experts || s.hidden != o.hidden || s.inter != o.inter)
    fail("moe_fp4_repack: staging for E {} D {} I {} does not match weights for E {} D {} I {}", s.experts, s.hidden,
         s.inter, o.experts, o.hidden, o.inter);
  if (staged.count() == 0) return;
  RepackArgs args{};
  for (int m = 0; m < 3; ++m) {
    args.packed[m] = staged.packed(m);
    args.scales[m] = staged.scales(m);
  }
  args.scale_2 = staged.scale_2();
  args.matrix_bytes = staged.matrix_bytes();
  args.scale_bytes = staged.scale_bytes();
  args.hidden = s.hidden;
  args.inter = s.inter;
  args.expert_begin = staged.begin();
  args.gate_up = out.mutable_gate_up();
  args.gate_up_scales = out.mutable_gate_up_scales();
  args.down = out.mutable_down();
  args.down_scales = out.mutable_down_scales();
  args.factors = out.mutable_factors();
  args.w4a8_gate_up_index = out.mutable_w4a8_gate_up_index();
  args.w4a8_down_index = out.mutable_w4a8_down_index();
  args.w4a8_gate_up_row_scale = out.mutable_w4a8_gate_up_row_scale();
  args.w4a8_down_row_scale = out.mutable_w4a8_down_row_scale();
  args.status = status.device();
  const int tiles = (2 * s.inter + s.hidden) / kMoeUnitRows;
  if (s.format == MoeFp4Format::Mxfp4) launch_repack<MoeFp4Format::Mxfp4>(args, staged.count(), tiles, stream);
  else launch_repack<MoeFp4Format::Nvfp4>(args, staged.count(), tiles, stream);
}

size_t moe_fp4_repack_device(const std::vector<MoeFp4ExpertTensors>& experts, MoeFp4Weights& out,
                             cudaStream_t stream, size_t max_staging_bytes) {
  const MoeFp4Shape& shape = out.shape();
  const int E = shape.experts, D = shape.hidden, I = shape.inter;
  // The CPU twin's checks, with its messages.
  if (E <= 0 || D <= 0 || I <= 0 || D % 128 || I % 128)
    fail("moe_fp4_repack: hidden {} and inter {} must be positive multiples of 128 (experts {})", D, I, E);
  if (E > 1024) fail("moe_fp4_repack: {} experts (at most 1024 supported by the routing kernel)", E);
  if (int(experts.size()) != E) fail("moe_fp4_repack: {} expert tensors given for {} experts", experts.size(), E);
  for (int e = 0; e < E; ++e) {
    const MoeFp4ExpertTensors& t = experts[size_t(e)];
    if (!t.w1 || !t.w1_scale || !t.w3 || !t.w3_scale || !t.w2 || !t.w2_scale)
      fail("moe_fp4_repack: expert {} has a missing tensor", e);
  }
  const int capacity =
      int(std::clamp<size_t>(max_staging_bytes / MoeFp4Staging::bytes_per_expert(shape), 1, size_t(E)));
  MoeFp4Staging staging(shape, capacity);
  MoeFp4RepackStatus status;
  status.reset(stream);
  for (int begin = 0; begin < E; begin += capacity) {
    staging.upload(experts, begin, std::min(capacity, E - begin), stream);
    moe_fp4_repack_enqueue(staging, out, status, stream);
  }
  return status.check(experts, stream);  // waits: the staging may be freed
}

std::vector<KernelLaunch> moe_fp4_repack_kernel_launches() {
  std::vector<KernelLaunch> out;
  for (MoeFp4Format f : {MoeFp4Format::Mxfp4, MoeFp4Format::Nvfp4}) {
    const std::string fa = moe_detail::format_template_arg(f);
    out.push_back({"moe_fp4_scan_scales_kernel<" + fa + ">", kRepackThreads, 0});
    out.push_back({"moe_fp4_repack_units_kernel<" + fa + ">", kRepackThreads, 0});
  }
  return out;
}

}  // namespace dsv4::cuda
