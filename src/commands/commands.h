// Each `dsv4 <command>` lives in its own file and registers itself on the CLI here.
#pragma once
#include <CLI/CLI.hpp>

namespace dsv4::commands {

// Model commands (commands/model_commands.cpp): inspect, make-tiny, generate, chat, logits, layer-check.
void add_model_commands(CLI::App& app);
// Text commands (commands/text_commands.cpp): tokenize, detokenize.
void add_text_commands(CLI::App& app);
// The OpenAI-compatible server (commands/serve_command.cpp): serve.
void add_serve_command(CLI::App& app);
// Op benchmarks (commands/bench_ops.cpp): bench-ops moe|attention|indexer.
void add_bench_ops_command(CLI::App& app);
// Decode-step profile (commands/profile_command.cpp): dsv4 profile.
void add_profile_command(CLI::App& app);
// Generation in the terminal, registered by add_model_commands: generate (generate_command.cpp)
// and the interactive chat (chat_command.cpp).
void add_generate_command(CLI::App& app);
void add_chat_command(CLI::App& app);
// --version: version, commit, build type and flags, CUDA architectures (version.cpp).
std::string version_text();
// Benchmarks (commands/bench_command.cpp): bench serve|sweep|latency.
void add_bench_command(CLI::App& app);

}  // namespace dsv4::commands
