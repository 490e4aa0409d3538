#include "model/parallel_layout.h"

#include <fmt/format.h>

namespace dsv4 {

std::string parallel_layout_problem(const ModelConfig& c, int world, bool expert_parallel) {
  if (world < 1) return fmt::format("the tensor-parallel size must be at least 1, not {}", world);
  if (world == 1) return "";
  const std::string n = fmt::format("tensor-parallel size {}", world);
  if (c.n_heads % world) return fmt::format("{} does not divide the model's {} attention heads", n, c.n_heads);
  if (c.o_groups % world) return fmt::format("{} does not divide the model's {} output groups (o_groups)", n, c.o_groups);
  // FP8 linears quantise their input per 128 channels and scale weights per 128 × 128: a shard
  // must hold whole blocks, so its partial sums are the unsplit op's block sums.
  const bool fp8 = c.linear_format == WeightFormat::FP8_BLOCK;
  const int q_rows = c.n_heads / world * c.head_dim, o_cols = c.o_groups / world * c.o_lora_rank;
  if (fp8 && q_rows % 128)
    return fmt::format("{} leaves {} query-projection rows per rank, not a multiple of the FP8 blocks' 128", n, q_rows);
  if (fp8 && o_cols % 128)
    return fmt::format("{} leaves {} output-projection inputs per rank, not a multiple of the FP8 blocks' 128", n, o_cols);
  if (c.moe_inter_dim % world)
    return fmt::format("{} does not divide the experts' intermediate size {} (moe_intermediate_size)", n, c.moe_inter_dim);
  // The shared expert is always split by its intermediate dimension, the routed ones too without
  // expert parallelism; FP4 experts (and FP8 ones) quantise w2's input per 128.
  const int inter = c.moe_inter_dim / world;
  bool quantised_experts = false;
  for (WeightFormat f : c.expert_format) quantised_experts |= f != WeightFormat::BF16;
  if ((fp8 || (!expert_parallel && quantised_experts)) && inter % 128)
    return fmt::format("{} leaves an intermediate slice of {} per rank, not a multiple of the quantisation blocks' 128", n,
                       inter);
  if (expert_parallel && c.n_routed_experts % world)
    return fmt::format("{} does not divide the model's {} routed experts (--expert-parallel)", n, c.n_routed_experts);
  return "";
}

}  // namespace dsv4
