// FP4 MoE on the GPU (backend/cuda/moe_fp4.h) against the CPU reference (backend/cpu/moe_fp4_reference.h):
// both weight formats, every kernel path, fresh random weights and routings each run (the seed is
// printed), outputs and intermediates poisoned with NaN before every run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/moe_fp4_reference.h"
#include "backend/cuda/act_quant_fp8.h"
#include "backend/cuda/moe_fp4.h"
#include "backend/cuda/row_ops.h"
#include "core/dtypes.h"
#include "moe_fp4_test_data.h"

namespace dsv4 {
namespace {

using cuda::DeviceBuffer;
using namespace moe_test;

// METHOD.md: bf16 operands land between 1e-3 and 1e-2 relative L2 error. The W4A8 path is compared
// with the CPU's FP8-activation reference on the same e4m3 operands, one GEMM at a time: gate-up (its
// bf16 SwiGLU output, the input of w2) against the reference's, then w2 and the sum against the
// reference run from the GPU's own w2 input. What differs is the FP8 tensor core's reduced-precision
// accumulation (docs/perf/fp8_accumulation_model.cpp). Compared end to end, the e4m3 quantisation of
// the w2 input sits between the two GEMMs and turns some of those small differences into whole e4m3
// steps (up to 1/8 of a value), which spreads the end-to-end figure up to ~1e-2 at small shapes
// (docs/perf/moe_fp4.md); each GEMM is held to the bf16 band, the end-to-end figure to the bound below.
constexpr double kW4A16Tolerance = 1e-2;
constexpr double kW4A8Tolerance = 1e-2;
// End to end, W4A8: the down GEMM's own difference (≤ kW4A8Tolerance, checked) plus what the gate-up
// difference becomes after the e4m3 quantisation of the w2 input. Take the reference's w2 input a and
// the GPU's b = a + δ, ||δ|| ≤ ε ||a|| (ε = kW4A8Tolerance, checked). Rounding both to the e4m3 grid
// (per-128 power-of-two scale; spacing Δ_i ≤ 2^-3 |a_i| for normal e4m3) changes nothing where no
// rounding boundary lies between a_i and b_i, and by one step Δ_i where one does, which for a_i
// anywhere in its grid cell happens with probability |δ_i| / Δ_i (for |δ_i| < Δ_i). So
//   E ||Q(b) − Q(a)||² = Σ |δ_i| Δ_i ≤ ||δ|| · 2^-3 ||a||   (Cauchy–Schwarz)  ≤ 2^-3 ε ||a||²,
// a relative L2 difference of at most √(ε/8) in the w2 input, which the random w2 passes on at the
// same relative size (E ||W v||² ∝ ||v||²) and the shared input can only dilute. Bound: ε + √(ε/8)
// = 4.5e-2. The accumulation model of docs/perf/fp8_accumulation_model.cpp (13 kept bits) at these
// shapes and distributions stays at or below 3.4e-2 over 1,800 draws (its tail: 1 token, no shared
// input, one large SwiGLU output crossing a step); the H200 records ≤ 1.1e-2.
const double kW4A8EndToEndBound = kW4A8Tolerance + std::sqrt(kW4A8Tolerance / 8);

// Runs every path at every token count on one freshly drawn layer.
// A path the format has but this GPU cannot run is reported (printed, and the test ends SKIPPED rather
// than passed, after the other paths have been checked); NVFP4 has no W4A8 path at all (docs/perf/moe_fp4.md).
void check_layer(const MoeFp4Shape& shape, int k, const std::vector<int>& token_counts, bool with_shared) {
  std::vector<std::string> not_run;
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
    const size_t hidden_elems = size_t(tokens) * k * shape.inter;
    // The FP8-activation twin (the golden-proven CPU backend's numerics): W4A8, and the W4A16 paths
    // run with MoeActivationNumerics::Fp8 as the CUDA backend runs them.
    std::vector<uint16_t> ref_fp8(ref.size()), ref_hidden(w4a8 ? hidden_elems : 0);
    cpu::moe_fp4_reference(shape, experts.views, x.data(), tokens, routing.ids.data(), routing.weights.data(), k,
                           with_shared ? shared.data() : nullptr, ref_fp8.data(), MoeActivationNumerics::Fp8,
                           {w4a8 ? ref_hidden.data() : nullptr, nullptr});
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
      if (fp8 && shape.format == MoeFp4Format::Nvfp4) continue;  // no such path (see above)
      if (!cuda::moe_fp4_path_available(path, shape)) {  // W4A8 / stream before sm_90
        const std::string name = cuda::moe_fp4_path_name(path);
        if (std::find(not_run.begin(), not_run.end(), name) == not_run.end()) {
          std::printf("%s: not available on this GPU, SKIPPED\n", name.c_str());
          not_run.push_back(name);
        }
        continue;
      }
      d_out.fill_bytes(0xff, stream.get());  // NaN
      ws.hidden_act.fill_bytes(0xff, stream.get());
      ws.expert_out.fill_bytes(0xff, stream.get());
      if (ws.act_fp8.size()) ws.act_fp8.fill_bytes(0x7f, stream.get());  // e4m3 NaN
      if (ws.act_scale.size()) ws.act_scale.fill_bytes(0xff, stream.get());
      cuda::moe_fp4_forward_path(path, weights, d_x.get(), tokens, d_ids.get(), d_w.get(), k,
                                 with_shared ? d_shared.get() : nullptr, d_out.get(), ws, stream.get());
      DSV4_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
      const std::vector<uint16_t> out = d_out.download(stream.get());
      const char* name = cuda::moe_fp4_path_name(path);
      ErrorStats s = compare(out, fp8 ? ref_fp8 : ref);
      std::printf("%s E=%d D=%d I=%d k=%d tokens=%d %s seed=%u: rel L2 %.2e, max abs %.3g, NaN %zu\n",
                  shape.format == MoeFp4Format::Mxfp4 ? "MXFP4" : "NVFP4", shape.experts, shape.hidden, shape.inter,
                  k, tokens, name, seed, s.rel_l2, s.max_abs, s.nans);
      EXPECT_EQ(s.nans, 0u) << "tokens " << tokens << " " << name;
      if (!fp8) {
        EXPECT_LE(s.rel_l2, kW4A16Tolerance) << "tokens " << tokens << " " << name;
        // Again on the FP8 grid: against the FP8 twin, with W4A8's end-to-end bound (the same
        // re-quantisation of the SwiGLU output amplifies the GEMMs' summation-order differences).
        d_out.fill_bytes(0xff, stream.get());
        ws.hidden_act.fill_bytes(0xff, stream.get());
        ws.expert_out.fill_bytes(0xff, stream.get());
        cuda::moe_fp4_forward_path(path, weights, d_x.get(), tokens, d_ids.get(), d_w.get(), k,
                                   with_shared ? d_shared.get() : nullptr, d_out.get(), ws, stream.get(),
                                   MoeActivationNumerics::Fp8);
        const std::vector<uint16_t> fp8_out = d_out.download(stream.get());
        if (path == cuda::MoeFp4Path::W4A16Decode) {
          // The decode path rounds the SwiGLU outputs inside its gate-up launch (a ticket per 128
          // channels): every routed pair's row must be on the FP8 grid already — rounding it again
          // (fp8_simulate_activations, idempotent) changes no bit — and hold no poison.
          std::vector<uint16_t> hidden = ws.hidden_act.download(stream.get());
          hidden.resize(hidden_elems);
          DeviceBuffer<uint16_t> again(hidden.size());
          again.upload(hidden, stream.get());
          cuda::fp8_simulate_activations(again.get(), int64_t(tokens) * k, shape.inter, stream.get());
          const std::vector<uint16_t> rounded = again.download(stream.get());
          size_t off_grid = 0, poisoned = 0;
          for (size_t p = 0; p < routing.ids.size(); ++p) {
            if (routing.ids[p] < 0 || routing.ids[p] >= shape.experts) continue;
            for (size_t c = p * shape.inter; c < (p + 1) * shape.inter; ++c) {
              off_grid += hidden[c] != rounded[c];
              poisoned += hidden[c] == 0xffff;
            }
          }
          EXPECT_EQ(off_grid, 0u) << "tokens " << tokens << " " << name << ": SwiGLU outputs off the FP8 grid";
          EXPECT_EQ(poisoned, 0u) << "tokens " << tokens << " " << name;
        }
        const ErrorStats g = compare(fp8_out, ref_fp8);
        std::printf("    FP8-grid activations: rel L2 %.2e against the FP8 twin (bound %.2e), NaN %zu\n", g.rel_l2,
                    kW4A8EndToEndBound, g.nans);
        EXPECT_EQ(g.nans, 0u) << "tokens " << tokens << " " << name << " FP8 grid";
        EXPECT_LE(g.rel_l2, kW4A8EndToEndBound) << "tokens " << tokens << " " << name << " FP8 grid";
        // x rounded by the caller (act_quant_fp8's values, as the CUDA backend passes them): the same bits.
        DeviceBuffer<uint8_t> d_q(x.size());
        DeviceBuffer<float> d_s(x.size() / 128);
        DeviceBuffer<uint16_t> d_xv(x.size());
        d_xv.fill_bytes(0xff, stream.get());
        cuda::act_quant_fp8(d_x.get(), tokens, shape.hidden, d_q.get(), d_s.get(), d_xv.get(), stream.get());
        d_out.fill_bytes(0xff, stream.get());
        ws.hidden_act.fill_bytes(0xff, stream.get());
        ws.expert_out.fill_bytes(0xff, stream.get());
        cuda::moe_fp4_forward_path(path, weights, d_x.get(), tokens, d_ids.get(), d_w.get(), k,
                                   with_shared ? d_shared.get() : nullptr, d_out.get(), ws, stream.get(),
                                   MoeActivationNumerics::Fp8, d_xv.get());
        EXPECT_TRUE(d_out.download(stream.get()) == fp8_out) << "tokens " << tokens << " " << name << " x rounded by act_quant_fp8";
        continue;
      }
      std::vector<uint16_t> hidden = ws.hidden_act.download(stream.get());
      hidden.resize(hidden_elems);
      std::vector<uint16_t> ref_down(ref.size());
      cpu::moe_fp4_reference(shape, experts.views, x.data(), tokens, routing.ids.data(), routing.weights.data(), k,
                             with_shared ? shared.data() : nullptr, ref_down.data(), MoeActivationNumerics::Fp8,
                             {nullptr, hidden.data()});
      const ErrorStats gate_up = compare(hidden, ref_hidden), down = compare(out, ref_down);
      std::printf("    per GEMM: gate-up rel L2 %.2e (NaN %zu), down + sum rel L2 %.2e\n", gate_up.rel_l2,
                  gate_up.nans, down.rel_l2);
      EXPECT_EQ(gate_up.nans, 0u) << "tokens " << tokens << " " << name;
      EXPECT_LE(gate_up.rel_l2, kW4A8Tolerance) << "tokens " << tokens << " " << name << " gate-up";
      EXPECT_LE(down.rel_l2, kW4A8Tolerance) << "tokens " << tokens << " " << name << " down";
      EXPECT_LE(s.rel_l2, kW4A8EndToEndBound) << "tokens " << tokens << " " << name << " end to end";
    }
  }
  if (!not_run.empty()) {
    std::string names;
    for (const auto& n : not_run) names += (names.empty() ? "" : ", ") + n;
    GTEST_SKIP() << "paths not run on this GPU: " << names << " (the other paths were checked)";
  }
}

// A tensor-parallel rank's part (moe_fp4_partials, Backend::moe_expert_partials) on every path,
// with a third of the pairs routed to experts another rank holds (id −1 here): each held pair's
// f32 row rounds to the forward's own expert output bit for bit, the other rows are 0, slot k is
// the shared input, and moe_combine_partials of the rows is the forward's output bit for bit. The
// held pairs' rows also against the CPU twin (moe_fp4_pair_outputs) on the FP8 grid.
void check_partials(const MoeFp4Shape& shape, int k, const std::vector<int>& token_counts) {
  uint32_t seed = fresh_seed();
  std::mt19937 rng(seed);
  HostExperts experts(shape, rng);
  cuda::MoeFp4Weights weights(shape, experts.views);
  const int max_tokens = *std::max_element(token_counts.begin(), token_counts.end());
  cuda::MoeWorkspace ws(shape, max_tokens, k);
  cuda::Stream stream;
  const int D = shape.hidden, slots = k + 1;
  for (int tokens : token_counts) {
    Routing routing = random_routing(tokens, k, shape.experts, rng);
    for (size_t p = 0; p < routing.ids.size(); ++p)
      if (rng() % 3 == 0) routing.ids[p] = -1;
    std::vector<uint16_t> x = random_bf16(size_t(tokens) * D, 1.0f, rng);
    std::vector<uint16_t> shared = random_bf16(size_t(tokens) * D, 0.5f, rng);
    std::vector<float> shared_f32(shared.size());
    for (size_t i = 0; i < shared.size(); ++i) shared_f32[i] = bf16_to_f32(shared[i]);
    std::vector<float> ref_rows(size_t(tokens) * slots * D, 0.f);
    cpu::moe_fp4_pair_outputs(shape, experts.views, x.data(), tokens, routing.ids.data(), routing.weights.data(), k,
                              ref_rows.data(), int64_t(slots) * D, MoeActivationNumerics::Fp8);
    DeviceBuffer<uint16_t> d_x(x.size()), d_shared(shared.size()), d_out(x.size()), d_combined(x.size());
    DeviceBuffer<float> d_shared_f32(shared.size()), d_partials(size_t(tokens) * slots * D), d_w(routing.weights.size());
    DeviceBuffer<int32_t> d_ids(routing.ids.size());
    d_x.upload(x, stream.get());
    d_shared.upload(shared, stream.get());
    d_shared_f32.upload(shared_f32, stream.get());
    d_ids.upload(routing.ids, stream.get());
    d_w.upload(routing.weights, stream.get());
    for (auto path : {cuda::MoeFp4Path::W4A16Stream, cuda::MoeFp4Path::W4A16Decode, cuda::MoeFp4Path::W4A16Batched,
                      cuda::MoeFp4Path::W4A8}) {
      if (path == cuda::MoeFp4Path::W4A8 && shape.format == MoeFp4Format::Nvfp4) continue;
      if (!cuda::moe_fp4_path_available(path, shape)) continue;  // reported by check_layer
      const char* name = cuda::moe_fp4_path_name(path);
      d_out.fill_bytes(0xff, stream.get());
      ws.expert_out.fill_bytes(0xff, stream.get());
      cuda::moe_fp4_forward_path(path, weights, d_x.get(), tokens, d_ids.get(), d_w.get(), k, d_shared.get(),
                                 d_out.get(), ws, stream.get(), MoeActivationNumerics::Fp8);
      const std::vector<uint16_t> want = d_out.download(stream.get());
      std::vector<uint16_t> pair_out = ws.expert_out.download(stream.get());
      d_partials.fill_bytes(0xff, stream.get());
      d_combined.fill_bytes(0xff, stream.get());
      ws.hidden_act.fill_bytes(0xff, stream.get());
      cuda::moe_fp4_partials(path, weights, d_x.get(), tokens, d_ids.get(), d_w.get(), k, d_shared_f32.get(),
                             d_partials.get(), ws, stream.get(), MoeActivationNumerics::Fp8);
      cuda::moe_combine_partials(d_partials.get(), d_ids.get(), tokens, k, D, d_combined.get(), stream.get());
      const std::vector<float> rows = d_partials.download(stream.get());
      size_t held_differ = 0, other_nonzero = 0, shared_differ = 0;
      std::vector<uint16_t> held, held_ref;
      for (int t = 0; t < tokens; ++t)
        for (int j = 0; j < slots; ++j)
          for (int c = 0; c < D; ++c) {
            const size_t at = (size_t(t) * slots + j) * D + c;
            const float v = rows[at];
            if (j == k) {
              shared_differ += std::memcmp(&v, &shared_f32[size_t(t) * D + c], 4) != 0;
            } else if (routing.ids[size_t(t) * k + j] < 0) {
              other_nonzero += !(v == 0.f);
            } else {
              held_differ += f32_to_bf16(v) != pair_out[(size_t(t) * k + j) * D + c];
              held.push_back(f32_to_bf16(v));
              held_ref.push_back(f32_to_bf16(ref_rows[at]));
            }
          }
      EXPECT_EQ(held_differ, 0u) << name << ", tokens " << tokens << ": held pairs' rows vs the forward's outputs";
      EXPECT_EQ(other_nonzero, 0u) << name << ", tokens " << tokens << ": rows of pairs held elsewhere";
      EXPECT_EQ(shared_differ, 0u) << name << ", tokens " << tokens << ": the shared row";
      EXPECT_EQ(d_combined.download(stream.get()), want) << name << ", tokens " << tokens << ": combined vs forward";
      const ErrorStats e = compare(held, held_ref);
      std::printf("partials %s E=%d D=%d k=%d tokens=%d %s seed=%u: held pairs vs the CPU twin rel L2 %.2e, NaN %zu\n",
                  shape.format == MoeFp4Format::Mxfp4 ? "MXFP4" : "NVFP4", shape.experts, D, k, tokens, name, seed,
                  e.rel_l2, e.nans);
      EXPECT_EQ(e.nans, 0u) << name;
      EXPECT_LE(e.rel_l2, kW4A8EndToEndBound) << name << ", tokens " << tokens;
    }
  }
}

class MoeFp4Gpu : public ::testing::TestWithParam<MoeFp4Format> {};

TEST_P(MoeFp4Gpu, TensorParallelPartials) {
  check_partials(shape_of(GetParam(), 32, 512, 256), 6, {1, 5, 64, 300});
  check_partials(shape_of(GetParam(), 12, 4096, 1024), 6, {1, 16});
}

// Small layer, every token count the issue names (1 … 4096), with and without the shared input.
TEST_P(MoeFp4Gpu, SmallLayerAllTokenCounts) {
  check_layer(shape_of(GetParam(), 32, 512, 256), 6, {1, 3, 16, 64, 257, 4096}, true);
  check_layer(shape_of(GetParam(), 32, 512, 256), 6, {3, 64}, false);
}

// Top-k past 8: the combines' 16-pair width (moe_routing.cu combine_width), the forward and a
// tensor-parallel rank's partials.
TEST_P(MoeFp4Gpu, WideTopK) {
  check_layer(shape_of(GetParam(), 32, 512, 256), 12, {1, 3, 16}, true);
  check_partials(shape_of(GetParam(), 32, 512, 256), 12, {1, 5});
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
  check_partials(shape_of(MoeFp4Format::Mxfp4, 8, 256, 128), 6, {3, 20});
}

}  // namespace
}  // namespace dsv4
