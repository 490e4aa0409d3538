// Random FP4 expert layers, routings and activations for the MoE tests (CPU and GPU), and their
// error statistics. Fresh random data on every run: the seed is printed by the tests that draw it.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cpu/moe_fp4_reference.h"
#include "core/dtypes.h"

namespace dsv4::moe_test {

inline uint32_t fresh_seed() {
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
inline Routing random_routing(int tokens, int k, int experts, std::mt19937& rng) {
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

inline std::vector<uint16_t> random_bf16(size_t n, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(d(rng));
  return v;
}

struct ErrorStats {
  double rel_l2 = 0, max_abs = 0;
  size_t nans = 0;
};

inline ErrorStats compare(const std::vector<uint16_t>& got, const std::vector<uint16_t>& ref) {
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

inline MoeFp4Shape shape_of(MoeFp4Format f, int E, int D, int I) {
  MoeFp4Shape s;
  s.format = f, s.experts = E, s.hidden = D, s.inter = I, s.swiglu_limit = 10.f;
  return s;
}

}  // namespace dsv4::moe_test
