// The GPU repack of FP4 routed experts (backend/cuda/moe_fp4_repack.h) against its CPU twin
// moe_fp4_repack (backend/moe_fp4_layout.h): every output buffer of MoeFp4Weights byte for byte —
// weights, scale bytes, factors and, for MXFP4, the W4A8 table indices and row factors — for both
// formats, tiny and DeepSeek-V4-Flash shapes, the whole layer staged at once and in chunks of two
// experts. Fresh random inputs on every run (the seed is printed), outputs poisoned with 0xff before
// each repack, and edge scales in every layer: zero codes, the largest codes, codes so far below a
// matrix's largest that their groups are stored as zeros or rounded in the W4A8 form, subnormal and
// extreme weight_scale_2. Invalid scales (NaN codes, negative e4m3, bad weight_scale_2) must fail
// with the CPU's message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/moe_fp4.h"
#include "backend/cuda/moe_fp4_repack.h"
#include "backend/moe_fp4_layout.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "moe_fp4_test_data.h"

namespace dsv4 {
namespace {

using namespace moe_test;

// Scale-code regimes, one per (expert, matrix) in turn, so every layer holds each of them.
enum class Regime { Typical, Wide, Extremes, Zero, Max, kCount };

void set_codes(MoeFp4Format f, Regime regime, std::vector<uint8_t>& codes, std::mt19937& rng) {
  const bool mx = f == MoeFp4Format::Mxfp4;
  // MXFP4: every code but 255 (NaN). NVFP4: every non-negative finite e4m3 code, and −0.
  auto any_valid = [&] {
    if (mx) return uint8_t(rng() % 255);
    const uint32_t c = rng() % 128;
    return uint8_t(c == 0x7f ? 0x80 : c);
  };
  const std::vector<uint8_t> extremes =
      mx ? std::vector<uint8_t>{0, 1, 2, 126, 127, 128, 253, 254} : std::vector<uint8_t>{0x00, 0x80, 0x01, 0x07, 0x08, 0x77, 0x78, 0x7e};
  for (uint8_t& c : codes) {
    switch (regime) {
      case Regime::Typical: break;  // HostExperts' own draw (MXFP4 2^-9..2^-4, NVFP4 any positive code)
      case Regime::Wide: c = any_valid(); break;
      case Regime::Extremes: c = extremes[rng() % extremes.size()]; break;
      case Regime::Zero: c = mx ? 0 : (rng() % 2 ? 0x80 : 0x00); break;
      case Regime::Max: c = mx ? uint8_t(254 - rng() % 3) : uint8_t(0x7e - rng() % 2); break;
      case Regime::kCount: break;
    }
  }
}

// A random layer with the regimes applied; NVFP4 weight_scale_2 cycles through edge values too.
HostExperts edge_layer(const MoeFp4Shape& shape, std::mt19937& rng) {
  HostExperts ex(shape, rng);
  const float scale_2_edges[] = {1e30f, 1e-40f /* subnormal */, FLT_MIN, 1.f, 3.0517578e-5f};
  for (int e = 0; e < shape.experts; ++e)
    for (int m = 0; m < 3; ++m) {
      const int turn = e * 3 + m;
      // bytes per expert: w1, w1 scales, w3, w3 scales, w2, w2 scales (views: w1, w3, w2)
      set_codes(shape.format, Regime(turn % int(Regime::kCount)), ex.bytes[size_t(e) * 6 + 2 * m + 1], rng);
      if (shape.format == MoeFp4Format::Nvfp4 && turn % 2) {
        float& s2 = m == 0 ? ex.views[e].w1_scale_2 : m == 1 ? ex.views[e].w3_scale_2 : ex.views[e].w2_scale_2;
        s2 = scale_2_edges[(turn / 2) % 5];
      }
    }
  return ex;
}

std::vector<uint8_t> download(const void* device, size_t bytes) {
  std::vector<uint8_t> host(bytes);
  if (bytes) DSV4_CUDA_CHECK(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost));
  return host;
}

// One device buffer against the CPU's vector: equal bytes, or where and how many differ.
template <typename T>
void expect_same_bytes(const char* what, const std::vector<T>& cpu, const void* device, size_t piece_bytes) {
  const size_t bytes = cpu.size() * sizeof(T);
  ASSERT_TRUE(device || bytes == 0) << what << ": no device buffer";
  const std::vector<uint8_t> gpu = download(device, bytes);
  const uint8_t* ref = reinterpret_cast<const uint8_t*>(cpu.data());
  if (bytes == 0 || std::memcmp(gpu.data(), ref, bytes) == 0) return;
  size_t first = bytes, count = 0;
  for (size_t i = 0; i < bytes; ++i)
    if (gpu[i] != ref[i]) first = std::min(first, i), ++count;
  ADD_FAILURE() << what << ": " << count << " of " << bytes << " bytes differ; first at byte " << first << " (piece "
                << first / piece_bytes << ", byte " << first % piece_bytes << " of " << piece_bytes << "): GPU 0x"
                << std::hex << int(gpu[first]) << ", CPU 0x" << int(ref[first]);
}

// On the repack's stream (a non-blocking stream does not wait for the legacy default stream).
void poison(cuda::MoeFp4Weights& w, const MoeFp4Repacked& rp, cudaStream_t stream) {
  auto fill = [&](void* p, size_t bytes) {
    if (bytes) DSV4_CUDA_CHECK(cudaMemsetAsync(p, 0xff, bytes, stream));
  };
  fill(w.mutable_gate_up(), rp.gate_up.size());
  fill(w.mutable_gate_up_scales(), rp.gate_up_scales.size());
  fill(w.mutable_down(), rp.down.size());
  fill(w.mutable_down_scales(), rp.down_scales.size());
  fill(w.mutable_factors(), rp.factors.size() * sizeof(float));
  fill(w.mutable_w4a8_gate_up_index(), rp.w4a8_gate_up_index.size());
  fill(w.mutable_w4a8_down_index(), rp.w4a8_down_index.size());
  fill(w.mutable_w4a8_gate_up_row_scale(), rp.w4a8_gate_up_row_scale.size() * sizeof(float));
  fill(w.mutable_w4a8_down_row_scale(), rp.w4a8_down_row_scale.size() * sizeof(float));
}

void expect_same_repack(const cuda::MoeFp4Weights& w, const MoeFp4Repacked& rp) {
  const int sb = moe_unit_scale_bytes(rp.shape.format);
  ASSERT_EQ(w.has_w4a8(), !rp.w4a8_gate_up_index.empty());
  expect_same_bytes("gate_up", rp.gate_up, w.gate_up(), kMoeUnitBytes);
  expect_same_bytes("gate_up_scales", rp.gate_up_scales, w.gate_up_scales(), sb);
  expect_same_bytes("down", rp.down, w.down(), kMoeUnitBytes);
  expect_same_bytes("down_scales", rp.down_scales, w.down_scales(), sb);
  expect_same_bytes("factors", rp.factors, w.factors(), kFactorsPerExpert * sizeof(float));
  expect_same_bytes("w4a8_gate_up_index", rp.w4a8_gate_up_index, w.w4a8_gate_up_index(), sb);
  expect_same_bytes("w4a8_down_index", rp.w4a8_down_index, w.w4a8_down_index(), sb);
  expect_same_bytes("w4a8_gate_up_row_scale", rp.w4a8_gate_up_row_scale, w.w4a8_gate_up_row_scale(),
                    16 * sizeof(float));
  expect_same_bytes("w4a8_down_row_scale", rp.w4a8_down_row_scale, w.w4a8_down_row_scale(), 16 * sizeof(float));
}

const char* format_name(MoeFp4Format f) { return f == MoeFp4Format::Mxfp4 ? "MXFP4" : "NVFP4"; }

// The CPU repack and the GPU repack (whole layer staged, then two experts per chunk) of one random layer.
void check_layer(const MoeFp4Shape& shape) {
  const uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  const HostExperts ex = edge_layer(shape, rng);
  const MoeFp4Repacked rp = moe_fp4_repack(shape, ex.views);
  std::printf("%s E=%d D=%d I=%d seed=%u: %zu W4A8 groups rounded\n", format_name(shape.format), shape.experts,
              shape.hidden, shape.inter, seed, rp.w4a8_rounded_groups);
  cuda::Stream stream;
  cuda::MoeFp4Weights w = cuda::MoeFp4Weights::allocate(shape);
  const size_t per_expert = cuda::MoeFp4Staging::bytes_per_expert(shape);
  for (size_t staging_bytes : {cuda::kMoeRepackStagingBytes, 2 * per_expert + per_expert / 2}) {
    SCOPED_TRACE("staging of " + std::to_string(std::min<size_t>(staging_bytes / per_expert, shape.experts)) +
                 " experts");
    poison(w, rp, stream.get());
    const size_t rounded = cuda::moe_fp4_repack_device(ex.views, w, stream.get(), staging_bytes);
    EXPECT_EQ(rounded, rp.w4a8_rounded_groups);
    expect_same_repack(w, rp);
  }
}

class MoeFp4RepackGpu : public ::testing::TestWithParam<MoeFp4Format> {};

TEST_P(MoeFp4RepackGpu, TinyShapes) {
  check_layer(shape_of(GetParam(), 3, 128, 128));
  check_layer(shape_of(GetParam(), 5, 128, 256));
  check_layer(shape_of(GetParam(), 2, 256, 128));
}

// DeepSeek-V4-Flash experts (hidden 4096, inter 2048), six of the 256.
TEST_P(MoeFp4RepackGpu, FlashShape) { check_layer(shape_of(GetParam(), 6, 4096, 2048)); }

// The constructor the loader's callers use repacks on the device too.
TEST_P(MoeFp4RepackGpu, WeightsConstructorMatchesCpu) {
  std::mt19937 rng(fresh_seed());
  const MoeFp4Shape shape = shape_of(GetParam(), 4, 256, 256);
  const HostExperts ex = edge_layer(shape, rng);
  expect_same_repack(cuda::MoeFp4Weights(shape, ex.views), moe_fp4_repack(shape, ex.views));
}

// The CPU repack's message for an invalid layer (run on one thread: its checks throw inside the loop).
std::string cpu_error(const MoeFp4Shape& shape, const std::vector<MoeFp4ExpertTensors>& views) {
  ThreadPool::set_global_threads(1);
  std::string message;
  try {
    moe_fp4_repack(shape, views);
  } catch (const Error& e) {
    message = e.what();
  }
  ThreadPool::set_global_threads(0);
  return message;
}

std::string gpu_error(const MoeFp4Shape& shape, const std::vector<MoeFp4ExpertTensors>& views) {
  cuda::Stream stream;
  cuda::MoeFp4Weights w = cuda::MoeFp4Weights::allocate(shape);
  try {
    cuda::moe_fp4_repack_device(views, w, stream.get());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// One invalid scale code or weight_scale_2 at a random place: both repacks fail with the same message.
// Two invalid codes: the GPU names the first in (expert, w1 / w3 / w2, index) order.
TEST_P(MoeFp4RepackGpu, InvalidScalesFailLikeTheCpu) {
  const MoeFp4Format f = GetParam();
  const uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  std::printf("%s invalid scales, seed=%u\n", format_name(f), seed);
  const MoeFp4Shape shape = shape_of(f, 4, 256, 128);
  const std::vector<uint8_t> bad_codes =
      f == MoeFp4Format::Mxfp4 ? std::vector<uint8_t>{255} : std::vector<uint8_t>{0x7f, 0xff, 0x81, 0xfe, 0x88};
  for (uint8_t code : bad_codes) {
    HostExperts ex(shape, rng);
    const int e = int(rng() % shape.experts), m = int(rng() % 3);
    std::vector<uint8_t>& scales = ex.bytes[size_t(e) * 6 + 2 * m + 1];
    const size_t index = rng() % scales.size();
    scales[index] = code;
    const std::string cpu = cpu_error(shape, ex.views);
    ASSERT_FALSE(cpu.empty()) << "code 0x" << std::hex << int(code);
    EXPECT_EQ(gpu_error(shape, ex.views), cpu) << "code 0x" << std::hex << int(code);
    // A second invalid code after the first: in a later expert, else later in the same matrix.
    if (e + 1 < shape.experts) {
      std::vector<uint8_t>& later = ex.bytes[size_t(e + 1) * 6 + 2 * int(rng() % 3) + 1];
      later[rng() % later.size()] = code;
    } else if (index + 1 < scales.size()) {
      scales[index + 1 + rng() % (scales.size() - index - 1)] = code;
    }
    EXPECT_EQ(gpu_error(shape, ex.views), cpu) << "code 0x" << std::hex << int(code) << ", two invalid codes";
  }
  if (f != MoeFp4Format::Nvfp4) return;
  for (float s2 : {std::numeric_limits<float>::quiet_NaN(), 0.f, -1e-3f, std::numeric_limits<float>::infinity(), 2e30f}) {
    HostExperts ex(shape, rng);
    const int e = int(rng() % shape.experts), m = int(rng() % 3);
    (m == 0 ? ex.views[e].w1_scale_2 : m == 1 ? ex.views[e].w3_scale_2 : ex.views[e].w2_scale_2) = s2;
    const std::string cpu = cpu_error(shape, ex.views);
    ASSERT_FALSE(cpu.empty()) << "weight_scale_2 " << s2;
    EXPECT_EQ(gpu_error(shape, ex.views), cpu) << "weight_scale_2 " << s2;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, MoeFp4RepackGpu, ::testing::Values(MoeFp4Format::Mxfp4, MoeFp4Format::Nvfp4),
                         [](const auto& info) { return info.param == MoeFp4Format::Mxfp4 ? "Mxfp4" : "Nvfp4"; });

// Small enough for compute-sanitizer memcheck (scripts/gpu-check.sh runs '*Sanitizer*').
TEST(MoeFp4RepackSanitizer, SmallBothFormats) {
  check_layer(shape_of(MoeFp4Format::Mxfp4, 3, 128, 256));
  check_layer(shape_of(MoeFp4Format::Nvfp4, 3, 256, 128));
}

}  // namespace
}  // namespace dsv4
