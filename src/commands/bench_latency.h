// `dsv4 bench latency`: the engine without HTTP (commands/bench_latency.cpp).
#pragma once
#include <CLI/CLI.hpp>

namespace dsv4::commands {

void add_bench_latency_command(CLI::App& bench);

}  // namespace dsv4::commands
