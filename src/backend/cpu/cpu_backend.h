// The CPU backend: the reference implementation of every op in backend.h, multi-threaded over rows.
// Numerics follow the DeepSeek-V4 reference step by step (SPEC §2–§3); where an exact reproduction
// is impossible (summation order inside a GEMM) the comment says what is done instead.
#pragma once
#include "backend/backend.h"

namespace dsv4 {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }

  Tensor alloc(DType dtype, std::vector<int64_t> shape) override;
  Tensor from_host(DType dtype, std::vector<int64_t> shape, const void* data) override;
  void upload(const Tensor& dst, const void* data) override;
  Tensor generate(const RandomFill& fill, DType dtype, std::vector<int64_t> shape) override;
  void to_host(const Tensor& t, void* dst) override;
  void copy_rows(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row, int64_t rows) override;
  Tensor gather_rows(const Tensor& src, const Tensor& rows) override;

  Tensor embed(const Tensor& ids, const uint16_t* table, int dim) override;
  Tensor rms_norm(const Tensor& x, const uint16_t* weight, float eps) override;
  void head_rms_norm(Tensor& x, int head_dim, float eps) override;
  void rope(Tensor& x, int head_dim, int rope_dim, const Tensor& positions, const RopeTable& table,
            bool inverse) override;
  void fp8_simulate(Tensor& x, int row_width, int channels) override;
  void hadamard_fp4_simulate(Tensor& x, int width) override;
  Tensor add(const Tensor& a, const Tensor& b) override;
  Tensor scale(const Tensor& x, float s) override;

  Tensor linear(const Tensor& x, const LinearWeight& w) override;
  Tensor linear_bf16(const Tensor& x, const uint16_t* w, int out, int in) override;
  Tensor linear_f32(const Tensor& x, const uint16_t* w, int out, int in) override;
  Tensor grouped_out_proj(const Tensor& o, const LinearWeight& wo_a, int groups, int rank) override;

  Tensor hc_pre(const Tensor& X, const HyperConnection& hc, int hc_mult, int iters, float norm_eps, float hc_eps,
                Tensor* post, Tensor* comb, const uint16_t* norm) override;
  Tensor hc_post(const Tensor& y, const Tensor& X, const Tensor& post, const Tensor& comb) override;
  Tensor hc_head(const Tensor& X, const HyperConnection& hc, int hc_mult, float norm_eps, float hc_eps,
                 const uint16_t* norm) override;

  void grow_pool(EntryPool& pool, int64_t pages) override;
  void write_entries(const Tensor& values, const Tensor& entries, EntryPool& pool) override;
  void copy_entries(const Tensor& src, const Tensor& dst, EntryPool& pool) override;
  Tensor step_indices(const StepIndexArgs& args) override;
  Tensor sparse_attention(const Tensor& q, int n_heads, int head_dim, const EntryPool& kv_pool, const Tensor& entry_lists,
                          const float* sink, float scale) override;
  Tensor indexer_topk(const Tensor& q, const Tensor& head_weights, int n_heads, const EntryPool& key_pool,
                      const KeyTables& keys, int k) override;

  void grow_compressor_states(CompressorStates& states, int64_t slots) override;
  void compressor_state_init(CompressorStates& states, int64_t slot) override;
  Tensor compressor_update(const Tensor& a, const Tensor& g, const StepTables& step, const Tensor& slots,
                           int64_t capacity, int64_t max_span_rows, const float* ape, CompressorStates& states) override;
  Tensor to_bf16(const Tensor& x) override;

  Routing route(const Tensor& x, const MoeWeights& w, const Tensor& token_ids, int k, float route_scale) override;
  Tensor moe_experts(const Tensor& x, const Routing& r, const MoeWeights& w, float swiglu_limit) override;

  Tensor linear_partial(const Tensor& x, const LinearWeight& w) override;
  Tensor moe_expert_partials(const Tensor& x, const Routing& r, const MoeWeights& w, float swiglu_limit) override;
  Tensor moe_combine(const Tensor& partials, const Routing& r) override;

  Tensor logits(const Tensor& h, const uint16_t* head, int vocab) override;
  Tensor sample(const Tensor& logits, const Tensor& params, const Tensor& counters) override;
  void apply_penalties(Tensor& logits, const Tensor& params, const Tensor& rows, const Tensor& ids,
                       const Tensor& counts) override;
  LogprobRows logprobs(const Tensor& logits, const Tensor& chosen, int top_n) override;
};

// Reference numerics shared by the CPU ops and their tests (backend/cpu/cpu_quant.cpp).
namespace cpu {
// FP8 activation quantisation of one block (SPEC §2.2): writes e4m3 codes, returns the power-of-two scale.
float quantize_fp8_block(const float* x, int n, uint8_t* codes);
// The power-of-two scale of a block with the given amax (floored at 1e-4), for FP8 (max 448).
float fp8_block_scale(float amax);
// FP4 scale (SPEC §2.6): amax floored at 6·2^-126, 2^ceil(log2(amax/6)).
float fp4_block_scale(float amax);
// In-place quantise-dequantise simulations on bf16 data (SPEC §2.5, §2.6).
void fp8_simulate_block(uint16_t* x, int n);
void fp4_simulate_block(uint16_t* x, int n);
// y = bf16(H·x · 128^-0.5) for a 128-wide bf16 vector (SPEC §2.7), f32 butterflies.
void hadamard128(uint16_t* x);
// Table of e4m3 code → f32 value.
const float* e4m3_table();
}  // namespace cpu

}  // namespace dsv4
