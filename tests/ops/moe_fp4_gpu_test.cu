// FP4 MoE on the GPU (backend/cuda/moe_fp4.h) against the CPU reference (backend/cpu/moe_fp4_reference.h):
// both weight formats, every kernel path, fresh random weights and routings each run (the seed is
// printed), outputs and intermediates poisoned with NaN before every run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/cpu/moe_fp4_reference.h"
#include "backend/cuda/moe_fp4.h"
#include "core/dtypes.h"

namespace dsv4 {
namespace {

using cuda::DeviceBuffer;

// METHOD.md: bf16 operands land between 1e-3 and 1e-2 relative L2 error. The W4A8 path is compared
// with the CPU's FP8-activation reference: the same e4m3 operands, so only the f32 summation order and
// the bf16 roundings it moves differ, and the same bound holds.
constexpr double kW4A16Tolerance = 1e-2;
constexpr double kW4A8Tolerance = 1e-2;

uint32_t fresh_seed() {
  static uint32_t seed = std::random_device{}();
  return seed++;
}

// One layer's experts in their on-disk format, with random contents.
struct HostExperts {
  MoeFp4Shape shape;
  std::vector<std::vector<uint8_t>> bytes;  // per expert: w1, w1s, w3, w3s, w2, w2s
  std::vector<MoeFp4ExpertTensors> views;

  HostExperts(const MoeFp4Shape& s, std::mt19937& rng) : shape(s) {
    const int D = s.hidden, I = s.inter, G = moe_fp4_group_size(s.format);
    std::uniform_int_distribution<int> byte(0, 255);
    // MXFP4: scales 2^-9..2^-4; NVFP4: any finite positive e4m3 code (subnormals included).
    std::uniform_int_distribution<int> mx_code(118, 123), nv_code(1, 0x7e);
    std::uniform_real_distribution<float> scale2(0.5e-3f, 2e-3f);
    auto scale_code = [&] { return uint8_t(s.format == MoeFp4Format::Mxfp4 ? mx_code(rng) : nv_code(rng)); };
    for (int e = 0; e < s.experts; ++e) {
      std::vector<size_t> sizes = {size_t(I) * D / 2, size_t(I) * D / G, size_t(I) * D / 2,
                                   size_t(I) * D / G, size_t(D) * I / 2, size_t(D) * I / G};
      for (int m = 0; m < 6; ++m) {
        std::vector<uint8_t> v(sizes[m]);
        for (auto& b : v) b = (m % 2 == 0) ? uint8_t(byte(rng)) : scale_code();
        bytes.push_back(std::move(v));
      }
    }
    for (int e = 0; e < s.experts; ++e) {
      auto* b = &bytes[size_t(e) * 6];
      MoeFp4ExpertTensors t{b[0].data(), b[1].data(), b[2].data(), b[3].data(), b[4].data(), b[5].data()};
      if (s.format == MoeFp4Format::Nvfp4) {
        // The NVFP4 scale_2 ~ amax/(6·448): with e4m3 block scales up to 448 this keeps weights O(0.1).
        t.w1_scale_2 = t.w3_scale_2 = scale2(rng) * 0.05f;
        t.w2_scale_2 = scale2(rng) * 0.05f;
      }
      views.push_back(t);
    }
  }
};

struct Routing {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// k distinct experts per token, weights in (0, 1.5] like renormalised · routed_scaling_factor.
Routing random_routing(int tokens, int k, int experts, std::mt19937& rng) {
  Routing r;
  std::uniform_real_distribution<float> w(0.05f, 1.5f);
  std::vector<int> perm(experts);
  for (int t = 0; t < tokens; ++t) {
    for (int e = 0; e < experts; ++e) perm[e] = e;
    for (int j = 0; j < k; ++j) {
      std::swap(perm[j], perm[j + rng() % (experts - j)]);
      r.ids.push_back(perm[j]);
      r.weights.push_back(w(rng));
    }
  }
  return r;
}

std::vector<uint16_t> random_bf16(size_t n, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(d(rng));
  return v;
}

struct ErrorStats {
  double rel_l2 = 0, max_abs = 0;
  size_t nans = 0;
};

ErrorStats compare(const std::vector<uint16_t>& got, const std::vector<uint16_t>& ref) {
  double num = 0, den = 0;
  ErrorStats s;
  for (size_t i = 0; i < got.size(); ++i) {
    double g = bf16_to_f32(got[i]), r = bf16_to_f32(ref[i]);
    if (std::isnan(g)) { ++s.nans; continue; }
    num += (g - r) * (g - r);
    den += r * r;
    s.max_abs = std::max(s.max_abs, std::fabs(g - r));
  }
  s.rel_l2 = std::sqrt(num / std::max(den, 1e-30));
  return s;
}

// Runs every path at every token count on one freshly drawn layer.
void check_layer(const MoeFp4Shape& shape, int k, const std::vector<int>& token_counts, bool with_shared) {
  uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  HostExperts experts(shape, rng);
  cuda::MoeFp4Weights weights(shape, experts.views);
  int max_tokens = *std::max_element(token_counts.begin(), token_counts.end());
  cuda::MoeWorkspace ws(shape, max_tokens, k);
  cuda::Stream stream;
  for (int tokens : token_counts) {
    Routing routing = random_routing(tokens, k, shape.experts, rng);
    std::vector<uint16_t> x = random_bf16(size_t(tokens) * shape.hidden, 1.0f, rng);
    std::vector<uint16_t> shared = random_bf16(size_t(tokens) * shape.hidden, 0.5f, rng);
    std::vector<uint16_t> ref(size_t(tokens) * shape.hidden);
    cpu::moe_fp4_reference(shape, experts.views, x.data(), tokens, routing.ids.data(), routing.weights.data(), k,
                           with_shared ? shared.data() : nullptr, ref.data(), MoeActivationNumerics::Bf16);
    const bool w4a8 = cuda::moe_fp4_path_available(cuda::MoeFp4Path::W4A8, shape);
    std::vector<uint16_t> ref_fp8(w4a8 ? ref.size() : 0);
    if (w4a8)
      cpu::moe_fp4_reference(shape, experts.views, x.data(), tokens, routing.ids.data(), routing.weights.data(), k,
                             with_shared ? shared.data() : nullptr, ref_fp8.data(), MoeActivationNumerics::Fp8);
    DeviceBuffer<uint16_t> d_x(x.size()), d_shared(shared.size()), d_out(ref.size());
    DeviceBuffer<int32_t> d_ids(routing.ids.size());
    DeviceBuffer<float> d_w(routing.weights.size());
    d_x.upload(x, stream.get());
    d_shared.upload(shared, stream.get());
    d_ids.upload(routing.ids, stream.get());
    d_w.upload(routing.weights, stream.get());
    for (auto path : {cuda::MoeFp4Path::W4A16Stream, cuda::MoeFp4Path::W4A16Decode, cuda::MoeFp4Path::W4A16Batched,
                      cuda::MoeFp4Path::W4A8}) {
      const bool fp8 = path == cuda::MoeFp4Path::W4A8;
      if (fp8 && !w4a8) continue;  // NVFP4, or not an sm_90 GPU
      d_out.fill_bytes(0xff, stream.get());  // NaN
      ws.hidden_act.fill_bytes(0xff, stream.get());
      ws.expert_out.fill_bytes(0xff, stream.get());
      if (ws.act_fp8.size()) ws.act_fp8.fill_bytes(0x7f, stream.get());  // e4m3 NaN
      if (ws.act_scale.size()) ws.act_scale.fill_bytes(0xff, stream.get());
      cuda::moe_fp4_forward_path(path, weights, d_x.get(), tokens, d_ids.get(), d_w.get(), k,
                                 with_shared ? d_shared.get() : nullptr, d_out.get(), ws, stream.get());
      DSV4_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
      ErrorStats s = compare(d_out.download(stream.get()), fp8 ? ref_fp8 : ref);
      std::printf("%s E=%d D=%d I=%d k=%d tokens=%d %s seed=%u: rel L2 %.2e, max abs %.3g, NaN %zu\n",
                  shape.format == MoeFp4Format::Mxfp4 ? "MXFP4" : "NVFP4", shape.experts, shape.hidden, shape.inter,
                  k, tokens, cuda::moe_fp4_path_name(path), seed, s.rel_l2, s.max_abs, s.nans);
      EXPECT_EQ(s.nans, 0u) << "tokens " << tokens << " " << cuda::moe_fp4_path_name(path);
      EXPECT_LE(s.rel_l2, fp8 ? kW4A8Tolerance : kW4A16Tolerance) << "tokens " << tokens << " "
                                                                   << cuda::moe_fp4_path_name(path);
    }
  }
}

MoeFp4Shape shape_of(MoeFp4Format f, int E, int D, int I) {
  MoeFp4Shape s;
  s.format = f, s.experts = E, s.hidden = D, s.inter = I, s.swiglu_limit = 10.f;
  return s;
}

class MoeFp4Gpu : public ::testing::TestWithParam<MoeFp4Format> {};

// The un-repack reproduces the on-disk dequantisation exactly.
TEST_P(MoeFp4Gpu, RepackRoundTripIsExact) {
  std::mt19937 rng(fresh_seed());
  MoeFp4Shape s = shape_of(GetParam(), 3, 256, 128);
  HostExperts ex(s, rng);
  cuda::MoeFp4Repacked rp = cuda::moe_fp4_repack(s, ex.views);
  for (int e = 0; e < s.experts; ++e) {
    const auto& t = ex.views[e];
    cuda::MoeFp4ExpertF32 w = cuda::moe_fp4_unrepack(rp, e);
    auto w1 = cpu::dequantize_fp4_matrix(s.format, t.w1, t.w1_scale, t.w1_scale_2, s.inter, s.hidden);
    auto w3 = cpu::dequantize_fp4_matrix(s.format, t.w3, t.w3_scale, t.w3_scale_2, s.inter, s.hidden);
    auto w2 = cpu::dequantize_fp4_matrix(s.format, t.w2, t.w2_scale, t.w2_scale_2, s.hidden, s.inter);
    ASSERT_EQ(w.w1, w1) << "expert " << e;
    ASSERT_EQ(w.w3, w3) << "expert " << e;
    ASSERT_EQ(w.w2, w2) << "expert " << e;
    if (s.format != MoeFp4Format::Mxfp4) continue;
    // The W4A8 form is exact too while a row's scales span at most 2^14 (these span 2^5).
    cuda::MoeFp4ExpertF32 w8 = cuda::moe_fp4_unrepack_w4a8(rp, e);
    ASSERT_EQ(w8.w1, w1) << "expert " << e;
    ASSERT_EQ(w8.w3, w3) << "expert " << e;
    ASSERT_EQ(w8.w2, w2) << "expert " << e;
  }
  EXPECT_EQ(rp.w4a8_rounded_groups, 0u);
}

// A row whose scales span more than 2^14: the far-down groups become e4m3 roundings of their values
// (what the kernel's tables hold), the rest stays exact, and the repack counts the rounded groups.
TEST(MoeFp4W4a8, WideScaleSpreadRoundsLikeE4m3) {
  std::mt19937 rng(fresh_seed());
  MoeFp4Shape s = shape_of(MoeFp4Format::Mxfp4, 1, 128, 128);
  HostExperts ex(s, rng);
  // w2 row 0: group 0 at 2^0, group 1 at 2^-10 (d = −4: exact), groups 2, 3 at 2^-20 (d = −14: rounded).
  uint8_t* w2s = ex.bytes[5].data();  // expert 0: w1, w1 scales, w3, w3 scales, w2, w2 scales
  const uint8_t codes[4] = {127, 117, 107, 107};
  for (int gi = 0; gi < 4; ++gi) w2s[gi] = codes[gi];
  cuda::MoeFp4Repacked rp = cuda::moe_fp4_repack(s, ex.views);
  EXPECT_EQ(rp.w4a8_rounded_groups, 2u);
  cuda::MoeFp4ExpertF32 w8 = cuda::moe_fp4_unrepack_w4a8(rp, 0);
  auto w2 = cpu::dequantize_fp4_matrix(s.format, ex.views[0].w2, ex.views[0].w2_scale, 1.f, s.hidden, s.inter);
  const float row_scale = std::ldexp(1.f, 127 - 133);
  for (int c = 0; c < s.inter; ++c) {
    float expect = c < 64 ? w2[c] : e4m3_to_f32(f32_to_e4m3(w2[c] / row_scale)) * row_scale;
    ASSERT_EQ(w8.w2[c], expect) << "column " << c;
  }
}

// Small layer, every token count the issue names (1 … 4096), with and without the shared input.
TEST_P(MoeFp4Gpu, SmallLayerAllTokenCounts) {
  check_layer(shape_of(GetParam(), 32, 512, 256), 6, {1, 3, 16, 64, 257, 4096}, true);
  check_layer(shape_of(GetParam(), 32, 512, 256), 6, {3, 64}, false);
}

// The smallest config-legal shape (tiny fixtures), k larger than half the experts.
TEST_P(MoeFp4Gpu, TinyLayer) { check_layer(shape_of(GetParam(), 4, 128, 128), 3, {1, 3, 16, 64, 257}, true); }

// DeepSeek-V4-Flash expert shapes (fewer experts, to keep the CPU reference quick).
TEST_P(MoeFp4Gpu, FlashShapes) { check_layer(shape_of(GetParam(), 12, 4096, 2048), 6, {1, 4, 16, 64}, true); }

INSTANTIATE_TEST_SUITE_P(Formats, MoeFp4Gpu, ::testing::Values(MoeFp4Format::Mxfp4, MoeFp4Format::Nvfp4),
                         [](const auto& info) { return info.param == MoeFp4Format::Mxfp4 ? "Mxfp4" : "Nvfp4"; });

// Small enough for compute-sanitizer memcheck (scripts/gpu-check.sh runs '*Sanitizer*').
TEST(MoeFp4Sanitizer, SmallBothFormats) {
  check_layer(shape_of(MoeFp4Format::Mxfp4, 8, 256, 128), 6, {3, 20}, true);
  check_layer(shape_of(MoeFp4Format::Nvfp4, 8, 256, 128), 6, {3}, false);
}

// The CPU reference's FP8-activation numerics stay close to its bf16 numerics (same function, coarser
// activations): a guard against a broken FP8 twin.
TEST(MoeFp4Reference, Fp8NumericsCloseToBf16) {
  std::mt19937 rng(fresh_seed());
  MoeFp4Shape s = shape_of(MoeFp4Format::Mxfp4, 8, 256, 256);
  HostExperts ex(s, rng);
  int tokens = 8, k = 4;
  Routing r = random_routing(tokens, k, s.experts, rng);
  auto x = random_bf16(size_t(tokens) * s.hidden, 1.f, rng);
  std::vector<uint16_t> a(x.size()), b(x.size());
  cpu::moe_fp4_reference(s, ex.views, x.data(), tokens, r.ids.data(), r.weights.data(), k, nullptr, a.data(),
                         MoeActivationNumerics::Bf16);
  cpu::moe_fp4_reference(s, ex.views, x.data(), tokens, r.ids.data(), r.weights.data(), k, nullptr, b.data(),
                         MoeActivationNumerics::Fp8);
  ErrorStats st = compare(b, a);
  std::printf("FP8 vs bf16 activations: rel L2 %.2e\n", st.rel_l2);
  EXPECT_GT(st.rel_l2, 0.0);
  EXPECT_LT(st.rel_l2, 0.1);
}

}  // namespace
}  // namespace dsv4
