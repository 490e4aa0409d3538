#ifdef DSV4_HAVE_CUDA
#include "bench/op_benchmarks.h"

#include "core/error.h"

namespace dsv4::bench {

void run_op_benchmark(const std::string& op) {
  if (op == "moe") return bench_moe();
  if (op == "moe-repack") return bench_moe_repack();
  if (op == "attention") return bench_attention();
  if (op == "indexer") return bench_indexer();
  if (op == "linear") return bench_linear();
  if (op == "persistent") return bench_persistent_layer();
  if (op == "chain") return bench_launch_chain();
  fail("bench-ops: unknown op '{}' (expected moe, moe-repack, attention, indexer, linear, persistent or chain)", op);
}

}  // namespace dsv4::bench
#endif
