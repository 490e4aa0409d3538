// Routed-expert MoE with FP4 weights (MXFP4 or NVFP4) on the GPU: SPEC.md §3.7 with the experts'
// GEMMs on tensor cores. Host API (all tensors on the device, no host sync, CUDA-graph capturable):
//
//   MoeFp4Weights weights(shape, experts_host, stream);      // once per layer, at load
//   MoeWorkspace ws(shape, max_tokens, k);                     // once, sized for the largest batch
//   moe_fp4_forward(weights, x, tokens, topk_ids, topk_weights, k, shared_or_null, out, ws, stream);
//
// out[t] = bf( Σ_j f32(y_{ids[t][j]}) + f32(shared[t]) ) with y_e as in SPEC §3.7 (bf16-rounded gate
// and up outputs, clamped SwiGLU, routing weight applied before w2, bf16-rounded expert outputs).
//
// The weight layout the kernels read and its load-time repack: backend/moe_fp4_layout.h (the CPU
// twin, moe_fp4_repack) and moe_fp4_repack.h (the GPU repack the loader runs).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cpu/moe_fp4_reference.h"
#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/device_limits.h"
#include "backend/moe_fp4_layout.h"

namespace dsv4::cuda {

// Rows (pairs of one expert) per pass of the decode kernels: one mma n8 tile.
constexpr int kMoeMaxPassRows = 8;

// Device copy of a repacked layer.
class MoeFp4Weights {
 public:
  // Repacked on the device from the on-disk tensors (moe_fp4_repack_device; waits for the stream).
  MoeFp4Weights(const MoeFp4Shape& shape, const std::vector<MoeFp4ExpertTensors>& experts,
                cudaStream_t stream = nullptr);
  // A copy of the CPU twin's repack.
  explicit MoeFp4Weights(const MoeFp4Repacked& repacked, cudaStream_t stream = nullptr);
  // Uninitialised device buffers of the right sizes (benchmarks fill them on the device).
  static MoeFp4Weights allocate(const MoeFp4Shape& shape);

  const MoeFp4Shape& shape() const { return shape_; }
  const uint8_t* gate_up() const { return gate_up_.get(); }
  const uint8_t* gate_up_scales() const { return gate_up_scales_.get(); }
  const uint8_t* down() const { return down_.get(); }
  const uint8_t* down_scales() const { return down_scales_.get(); }
  const float* factors() const { return factors_.get(); }
  uint8_t* mutable_gate_up() { return gate_up_.get(); }
  uint8_t* mutable_gate_up_scales() { return gate_up_scales_.get(); }
  uint8_t* mutable_down() { return down_.get(); }
  uint8_t* mutable_down_scales() { return down_scales_.get(); }
  float* mutable_factors() { return factors_.get(); }
  // W4A8 form (MXFP4 only; null for NVFP4).
  bool has_w4a8() const { return w4a8_gate_up_index_.size() != 0; }
  const uint8_t* w4a8_gate_up_index() const { return w4a8_gate_up_index_.get(); }
  const uint8_t* w4a8_down_index() const { return w4a8_down_index_.get(); }
  const float* w4a8_gate_up_row_scale() const { return w4a8_gate_up_row_scale_.get(); }
  const float* w4a8_down_row_scale() const { return w4a8_down_row_scale_.get(); }
  uint8_t* mutable_w4a8_gate_up_index() { return w4a8_gate_up_index_.get(); }
  uint8_t* mutable_w4a8_down_index() { return w4a8_down_index_.get(); }
  float* mutable_w4a8_gate_up_row_scale() { return w4a8_gate_up_row_scale_.get(); }
  float* mutable_w4a8_down_row_scale() { return w4a8_down_row_scale_.get(); }
  // Bytes one expert occupies (weights + scales), for bandwidth accounting.
  size_t expert_bytes() const;

 private:
  explicit MoeFp4Weights(const MoeFp4Shape& shape);
  MoeFp4Shape shape_;
  DeviceBuffer<uint8_t> gate_up_, gate_up_scales_, down_, down_scales_;
  DeviceBuffer<float> factors_;
  DeviceBuffer<uint8_t> w4a8_gate_up_index_, w4a8_down_index_;
  DeviceBuffer<float> w4a8_gate_up_row_scale_, w4a8_down_row_scale_;
};

// Scratch of one forward, sized for up to max_tokens tokens with k experts each.
class MoeWorkspace {
 public:
  MoeWorkspace(const MoeFp4Shape& shape, int max_tokens, int k);
  int max_tokens() const { return max_tokens_; }
  int k() const { return k_; }

  // Routing (moe_routing.cu): experts with at least one pair, compacted into "slots".
  DeviceBuffer<int32_t> active_count;  // [1]
  DeviceBuffer<int32_t> slot_expert;   // [E]
  DeviceBuffer<int32_t> slot_begin;    // [E] offset into sorted_pairs
  DeviceBuffer<int32_t> slot_count;    // [E]
  DeviceBuffer<int32_t> sorted_pairs;  // [max_tokens·k] pair index t·k+j, grouped by expert
  // The same pairs cut into passes of at most min(kMoeMaxPassRows, tokens) rows of one expert, in
  // expert order (the streaming decode kernel's work list).
  DeviceBuffer<int32_t> pass_total;    // [1]
  DeviceBuffer<int32_t> pass_expert;   // [E + max_tokens·k]
  DeviceBuffer<int32_t> pass_begin;    // offset into sorted_pairs
  DeviceBuffer<int32_t> pass_rows;
  // Activations between the two GEMMs and per-pair expert outputs, indexed by pair t·k+j.
  DeviceBuffer<uint16_t> hidden_act;   // [max_tokens·k, I] bf16
  DeviceBuffer<uint16_t> expert_out;   // [max_tokens·k, D] bf16
  // W4A8 (allocated only where that path can run): the GEMM's input quantised to e4m3 with one f32
  // scale per 128 channels — x [tokens, D] for gate-up, then hidden_act [pairs, I] for down (§2.2).
  DeviceBuffer<uint8_t> act_fp8;
  DeviceBuffer<float> act_scale;

 private:
  int max_tokens_ = 0, k_ = 0;
};

// Which kernel path runs the expert GEMMs. The choice is made in one place, moe_fp4_select_path().
enum class MoeFp4Path : uint8_t {
  W4A16Stream,   // bf16 mma.sync, weights on the M side, ≤ 8 tokens per pass, weights streamed through a
                 // shared-memory ring by the bulk copy engine, persistent warp-specialised grid
                 // (moe_fp4_stream.cu, sm_90+); forced only: slower than W4A16Decode on the H200
                 // (docs/perf/moe_fp4.md)
  W4A16Decode,   // bf16 mma.sync, weights on the M side, ≤ 8 tokens per pass, loads in registers
  W4A16Batched,  // bf16 mma.sync, tokens on the M side in tiles of 64 staged in shared memory, weights
                 // unpacked into B fragments once per 64 tokens (moe_fp4_tiled.cu)
  W4A8,          // sm_90a, MXFP4: e4m3 weights and activations, FP8 wgmma on 128-token tiles; the
                 // reference's own expert numerics (SPEC §2.4), moe_fp4_w4a8.cu
};
// Whether `path` can run for `shape` on a device with `limits` (W4A8 needs MXFP4 and an sm_90 GPU
// running the sm_90a code; the streaming kernel an sm_90+ GPU with shared memory for two ring stages
// of both GEMMs), and the path the dispatcher takes there. Host code, no GPU needed; the forms
// without limits ask about the current device.
bool moe_fp4_path_available(MoeFp4Path path, const MoeFp4Shape& shape, const DeviceLimits& limits);
MoeFp4Path moe_fp4_select_path(const MoeFp4Shape& shape, int tokens, int k, const DeviceLimits& limits);
bool moe_fp4_path_available(MoeFp4Path path, const MoeFp4Shape& shape);
MoeFp4Path moe_fp4_select_path(const MoeFp4Shape& shape, int tokens, int k);
// Every kernel the MoE forward may launch for `shape` on a device with `limits`: each available
// path's GEMMs (W4A16 stream and W4A8 only where available), the routing and combine kernels.
std::vector<KernelLaunch> moe_fp4_kernel_launches(const MoeFp4Shape& shape, const DeviceLimits& limits);
const char* moe_fp4_path_name(MoeFp4Path path);

// The forward. x, shared_or_null, out: bf16 [tokens, D] (shared_or_null may be nullptr); topk_ids
// int32 [tokens, k]; topk_weights f32 [tokens, k]. Pairs with ids outside [0, E) contribute nothing.
// `numerics` sets the W4A16 paths' activations: Bf16 feeds the GEMMs bf16 (the kernels' own route);
// Fp8 first rounds x and the SwiGLU output to the reference's FP8 grid per 128 channels (SPEC §2.2,
// as bf16 values: exact), so they compute the reference's expert numerics up to summation order —
// what the golden tests hold the model to. W4A8 is FP8 either way. Fp8 needs x distinct from the
// workspace (its rounded copy goes to ws.expert_out, which the down GEMM overwrites later). x_fp8
// (optional, Fp8 only): x already on that grid (act_quant_fp8's values of x), which the W4A16 paths
// then read instead of rounding x themselves (W4A8 quantises x as always).
void moe_fp4_forward(const MoeFp4Weights& weights, const uint16_t* x, int tokens, const int32_t* topk_ids,
                     const float* topk_weights, int k, const uint16_t* shared_or_null, uint16_t* out,
                     MoeWorkspace& ws, cudaStream_t stream, MoeActivationNumerics numerics = MoeActivationNumerics::Bf16);
// Same, with the path forced (tests and benchmarks).
void moe_fp4_forward_path(MoeFp4Path path, const MoeFp4Weights& weights, const uint16_t* x, int tokens,
                          const int32_t* topk_ids, const float* topk_weights, int k,
                          const uint16_t* shared_or_null, uint16_t* out, MoeWorkspace& ws, cudaStream_t stream,
                          MoeActivationNumerics numerics = MoeActivationNumerics::Bf16, const uint16_t* x_fp8 = nullptr);

// A tensor-parallel rank's part of the forward (Backend::moe_expert_partials): partials f32
// [tokens, k + 1, D] get, in row t·(k+1)+j, pair (t, j)'s down output before its bf16 rounding —
// the rank's sum over its slice of the intermediate dimension — or 0 where topk_ids[t·k+j] is
// outside [0, E) (an expert another rank holds); row t·(k+1)+k gets shared_or_null's row t (f32
// [tokens, D]; 0 where null). Unsplit, moe_combine_partials of these is moe_fp4_forward_path's out,
// bit for bit. The same paths, numerics and workspace as the forward.
void moe_fp4_partials(MoeFp4Path path, const MoeFp4Weights& weights, const uint16_t* x, int tokens,
                      const int32_t* topk_ids, const float* topk_weights, int k, const float* shared_or_null,
                      float* partials, MoeWorkspace& ws, cudaStream_t stream,
                      MoeActivationNumerics numerics = MoeActivationNumerics::Bf16, const uint16_t* x_fp8 = nullptr);

// The routing and both GEMMs of the two above, without their last step: each pair's bf16 output in
// ws.expert_out (partials null), or its f32 output in partials' pair rows. moe_combine or
// moe_partials_finish then completes the forward or the partials (a caller that computes the shared
// expert beside the GEMMs adds it there). pairs_grouped: ws already holds topk_ids grouped for this
// path (moe_route_topk_pairs), so the grouping launch is skipped.
void moe_fp4_experts(MoeFp4Path path, const MoeFp4Weights& weights, const uint16_t* x, const uint16_t* x_fp8,
                     int tokens, const int32_t* topk_ids, const float* topk_weights, int k, float* partials,
                     MoeWorkspace& ws, cudaStream_t stream, MoeActivationNumerics numerics,
                     bool pairs_grouped = false);

// Routing-side kernels (moe_routing.cu).
// Groups the tokens·k pairs by expert into ws (slots, sorted_pairs and, with_passes, the passes the
// streaming kernel reads); one block, no host sync.
void moe_route_pairs(const int32_t* topk_ids, int tokens, int k, int experts, bool with_passes, MoeWorkspace& ws,
                     cudaStream_t stream);
// route_topk (router.h) and moe_route_pairs in one launch, for up to kFusedRouteTokens tokens and E ≤ 256:
// the ids and weights route_topk gives, grouped into ws as moe_route_pairs groups them. Returns false
// (nothing enqueued) where it does not apply: the caller runs the two.
inline constexpr int kFusedRouteTokens = 4;
bool moe_route_topk_pairs(const float* logits, const float* bias, const int32_t* hash_table, const int32_t* token_ids,
                          int tokens, int E, int k, float route_scale, int32_t* ids, float* weights, int experts,
                          bool with_passes, MoeWorkspace& ws, cudaStream_t stream);
// out[t] = bf( Σ_j expert_out[t·k+j] (in order of expert id) + shared[t] ).
void moe_combine(const uint16_t* expert_out, const int32_t* topk_ids, int tokens, int k, int experts, int hidden,
                 const uint16_t* shared_or_null, uint16_t* out, cudaStream_t stream);
// moe_fp4_partials' last step: the rows of pairs outside [0, experts) zeroed, the shared rows filled.
void moe_partials_finish(const int32_t* topk_ids, int tokens, int k, int experts, int hidden, const float* shared_or_null,
                         float* partials, cudaStream_t stream);
// Summed partials (f32 [tokens, k + 1, hidden]) → out bf16 [tokens, hidden] as moe_combine ends:
// every row rounded to bf16 first, the pairs with ids ≥ 0 in order of expert id, then row k.
void moe_combine_partials(const float* partials, const int32_t* topk_ids, int tokens, int k, int hidden, uint16_t* out,
                          cudaStream_t stream);
// ids[i] − begin where that lies in [0, count), else −1: an expert-parallel rank's local expert ids.
void moe_local_expert_ids(const int32_t* ids, int64_t n, int begin, int count, int32_t* out, cudaStream_t stream);
// The routing and combine kernels' launches (moe_fp4_kernel_launches).
std::vector<KernelLaunch> moe_routing_kernel_launches();

}  // namespace dsv4::cuda
