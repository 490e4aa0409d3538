// `dsv4 bench-ops <op>`: kernel benchmarks (CUDA builds only).
#include "commands/commands.h"

#include "commands/cli_options.h"

#include "backend/backend.h"
#include "core/error.h"

#ifdef DSV4_HAVE_CUDA
#include "bench/op_benchmarks.h"
#endif

namespace dsv4::commands {

void add_bench_ops_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench-ops", "Benchmark GPU kernels (markdown tables on stdout)");
  auto op = std::make_shared<std::string>();
  cmd->add_option("op", *op, "Which op: moe | moe-repack | attention | indexer | linear | persistent | chain")
      ->required()
      ->check(one_of({"moe", "moe-repack", "attention", "indexer", "linear", "persistent", "chain"}));
  cmd->footer(
      "Each table times CUDA-graph replays over rotating weights/caches and reports % of the\n"
      "device-to-device copy bandwidth measured in the same run. Environment variables narrow a run:\n"
      "  moe:       DSV4_MOE_BENCH_TOKENS=1,4,16        token counts (default 1,4,16,64,256,1024,8192)\n"
      "             DSV4_MOE_BENCH_PATH=decode,batched  kernel paths instead of the dispatcher's choice\n"
      "                                                 (stream, decode, batched, w4a8)\n"
      "             DSV4_MOE_BENCH_FORMAT=mxfp4|nvfp4   one expert format (default both)\n"
      "  moe-repack: the load-time repack of one Flash layer, GPU vs CPU (DSV4_MOE_BENCH_FORMAT too)\n"
      "  attention: DSV4_ATTN_BENCH_SHAPES=1x1,128x2    batch x s_q\n"
      "             DSV4_ATTN_BENCH_VARIANTS=wgmma      substrings of the variant names (fused,\n"
      "                                                 separate, reference, wgmma, unsplit)\n"
      "  indexer:   DSV4_INDEXER_BENCH_SHAPES=1x16384x512  batch x keys x k\n"
      "  linear:    the Flash FP8 projections and the bf16 head, CUDA-core kernel vs cuBLASLt, M = 1 … 8192\n"
      "             DSV4_LINEAR_BENCH_SHAPES=wq_b,head      wq_a wq_b wkv wo_b indexer_wq_b shared_w1_w3\n"
      "                                                   shared_w2 head\n"
      "             DSV4_LINEAR_BENCH_ROWS=1,128            row counts M\n"
      "  persistent: SWA, CSA and HCA layers at one row as a kernel chain and as one resident kernel (grid\n"
      "             barriers; with and without the next weights copied to shared memory during latency\n"
      "             stretches), and the 43 layers projected from them\n"
      "  chain:     one link of a dependent launch chain, with the same kernel in every link or 16 distinct\n"
      "             ones (their instructions cold), bodies of ~0, 16 and 32 KB of code, with and without\n"
      "             an L2-sized read between links\n");
  cmd->callback([op] {
    // Checked first, so a machine without a GPU gets one line instead of a driver error.
    const std::string why = cuda_unavailable_reason();
    if (!why.empty()) fail("bench-ops runs on a GPU: {}", why);
#ifdef DSV4_HAVE_CUDA
    bench::run_op_benchmark(*op);
#endif
  });
}

}  // namespace dsv4::commands
