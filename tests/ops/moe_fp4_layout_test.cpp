// The FP4 MoE weight layout's load-time repack (backend/moe_fp4_layout.h) against the on-disk
// dequantisation, for both formats and the W4A8 form, and the CPU reference's two activation
// numerics against each other. Host code only: runs without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/cpu/moe_fp4_reference.h"
#include "backend/moe_fp4_layout.h"
#include "core/dtypes.h"
#include "moe_fp4_test_data.h"

namespace dsv4 {
namespace {

using namespace moe_test;

class MoeFp4Layout : public ::testing::TestWithParam<MoeFp4Format> {};

// The un-repack reproduces the on-disk dequantisation exactly.
TEST_P(MoeFp4Layout, RepackRoundTripIsExact) {
  std::mt19937 rng(fresh_seed());
  MoeFp4Shape s = shape_of(GetParam(), 3, 256, 128);
  HostExperts ex(s, rng);
  MoeFp4Repacked rp = moe_fp4_repack(s, ex.views);
  for (int e = 0; e < s.experts; ++e) {
    const auto& t = ex.views[e];
    MoeFp4ExpertF32 w = moe_fp4_unrepack(rp, e);
    auto w1 = cpu::dequantize_fp4_matrix(s.format, t.w1, t.w1_scale, t.w1_scale_2, s.inter, s.hidden);
    auto w3 = cpu::dequantize_fp4_matrix(s.format, t.w3, t.w3_scale, t.w3_scale_2, s.inter, s.hidden);
    auto w2 = cpu::dequantize_fp4_matrix(s.format, t.w2, t.w2_scale, t.w2_scale_2, s.hidden, s.inter);
    ASSERT_EQ(w.w1, w1) << "expert " << e;
    ASSERT_EQ(w.w3, w3) << "expert " << e;
    ASSERT_EQ(w.w2, w2) << "expert " << e;
    if (s.format != MoeFp4Format::Mxfp4) continue;
    // The W4A8 form is exact too while a row's scales span at most 2^14 (these span 2^5).
    MoeFp4ExpertF32 w8 = moe_fp4_unrepack_w4a8(rp, e);
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
  MoeFp4Repacked rp = moe_fp4_repack(s, ex.views);
  EXPECT_EQ(rp.w4a8_rounded_groups, 2u);
  MoeFp4ExpertF32 w8 = moe_fp4_unrepack_w4a8(rp, 0);
  auto w2 = cpu::dequantize_fp4_matrix(s.format, ex.views[0].w2, ex.views[0].w2_scale, 1.f, s.hidden, s.inter);
  const float row_scale = std::ldexp(1.f, 127 - 133);
  for (int c = 0; c < s.inter; ++c) {
    float expect = c < 64 ? w2[c] : e4m3_to_f32(f32_to_e4m3(w2[c] / row_scale)) * row_scale;
    ASSERT_EQ(w8.w2[c], expect) << "column " << c;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, MoeFp4Layout, ::testing::Values(MoeFp4Format::Mxfp4, MoeFp4Format::Nvfp4),
                         [](const auto& info) { return info.param == MoeFp4Format::Mxfp4 ? "Mxfp4" : "Nvfp4"; });

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

// The hidden tap (the per-GEMM checks of the GPU tests): what the reference writes out as w2's input,
// read back in, gives the same output bit for bit; rows of pairs without an expert are left alone.
TEST(MoeFp4Reference, HiddenTapRoundTrips) {
  std::mt19937 rng(fresh_seed());
  MoeFp4Shape s = shape_of(MoeFp4Format::Mxfp4, 8, 256, 128);
  HostExperts ex(s, rng);
  const int tokens = 5, k = 3;
  Routing r = random_routing(tokens, k, s.experts, rng);
  r.ids[4] = -1;  // pair 4 has no expert
  auto x = random_bf16(size_t(tokens) * s.hidden, 1.f, rng);
  auto shared = random_bf16(x.size(), 0.5f, rng);
  for (auto numerics : {MoeActivationNumerics::Bf16, MoeActivationNumerics::Fp8}) {
    std::vector<uint16_t> hidden(size_t(tokens) * k * s.inter, 0x7fc0), a(x.size()), b(x.size());
    cpu::moe_fp4_reference(s, ex.views, x.data(), tokens, r.ids.data(), r.weights.data(), k, shared.data(), a.data(),
                           numerics, {hidden.data(), nullptr});
    for (int i = 0; i < s.inter; ++i) ASSERT_EQ(hidden[size_t(4) * s.inter + i], 0x7fc0) << "pair without an expert";
    ASSERT_NE(hidden[0], 0x7fc0);
    cpu::moe_fp4_reference(s, ex.views, x.data(), tokens, r.ids.data(), r.weights.data(), k, shared.data(), b.data(),
                           numerics, {nullptr, hidden.data()});
    EXPECT_EQ(a, b);
  }
}

}  // namespace
}  // namespace dsv4
