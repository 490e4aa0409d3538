// GPU op benchmarks behind `dsv4 bench-ops`. Each prints markdown tables to stdout: time (median of
// CUDA-graph replays over rotating inputs), bytes, GB/s, % of the copy bandwidth measured in the same
// run, TFLOP/s, and the ratio to a baseline timed in the same run.
#pragma once
#include <string>

namespace dsv4::bench {

void run_op_benchmark(const std::string& op);

// Implemented in src/bench/*_bench.cu (compiled into the CUDA backend library).
void bench_moe();
void bench_moe_repack();
void bench_attention();
void bench_indexer();
void bench_linear();
void bench_persistent_layer();
void bench_launch_chain();

}  // namespace dsv4::bench
