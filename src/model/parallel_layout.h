// How one model is split over the ranks of a tensor-parallel group (docs/ARCHITECTURE.md "Tensor
// parallelism"): attention heads and output groups, the routed experts by intermediate dimension
// (tensor parallel) or by expert (expert parallel), the shared expert by intermediate dimension.
#pragma once
#include <string>

#include "checkpoint/model_config.h"

namespace dsv4 {

struct ParallelLayout {
  int rank = 0, world = 1;
  bool expert_parallel = false;  // routed experts whole, n_routed / world per rank
  bool split() const { return world > 1; }
};

// Why `c` cannot be split over `world` ranks this way, as one sentence naming the size that does
// not divide ("" when it can): heads and output groups by rank, the row-parallel inputs (wo_b's,
// each expert's w2) in whole 128-wide quantisation blocks, experts by rank for expert parallelism.
std::string parallel_layout_problem(const ModelConfig& c, int world, bool expert_parallel);

}  // namespace dsv4
