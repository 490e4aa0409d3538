// `dsv4 bench-ops <op>`: kernel benchmarks (CUDA builds only).
#include "commands/commands.h"

#include "core/error.h"

#ifdef DSV4_HAVE_CUDA
#include "bench/op_benchmarks.h"
#endif

namespace dsv4::commands {

void add_bench_ops_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench-ops", "Benchmark GPU kernels (markdown tables on stdout)");
  auto op = std::make_shared<std::string>();
  cmd->add_option("op", *op, "Which op: moe | attention | indexer")->required();
  cmd->callback([op] {
#ifdef DSV4_HAVE_CUDA
    bench::run_op_benchmark(*op);
#else
    fail("bench-ops needs the CUDA backend, which this build does not have (configure with DSV4_CUDA=ON)");
#endif
  });
}

}  // namespace dsv4::commands
