// dsv4: DeepSeek-V4 inference engine. `dsv4 --help` lists the commands.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "commands/cli_options.h"
#include "commands/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"

int main(int argc, char** argv) {
  CLI::App app{"dsv4 - a DeepSeek-V4 inference engine"};
  app.require_subcommand(1);
  app.fallthrough();  // global options (--threads, -q, -v) may also follow the command
  int threads = 0;
  bool quiet = false, verbose = false;
  const int cores = dsv4::commands::available_cores();
  app.set_version_flag("--version", dsv4::commands::version_text, "Print the version, commit, build flags and CUDA architectures");
  app.add_option("--threads", threads, fmt::format("CPU worker threads, 1 to {} (default: one per core)", cores))
      ->check(dsv4::commands::integer_in(1, cores, "this machine's cores"));
  app.add_flag("-q,--quiet", quiet, "Only print results and errors");
  app.add_flag("-v,--verbose", verbose, "Print debug messages");
  app.parse_complete_callback([&] {
    if (quiet) dsv4::log_level() = dsv4::LogLevel::Quiet;
    if (verbose) dsv4::log_level() = dsv4::LogLevel::Debug;
    if (threads > 0) dsv4::ThreadPool::set_global_threads(threads);
  });
  dsv4::commands::add_model_commands(app);
  dsv4::commands::add_text_commands(app);
  dsv4::commands::add_serve_command(app);
  dsv4::commands::add_bench_ops_command(app);
  dsv4::commands::add_profile_command(app);
  dsv4::commands::add_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return dsv4::commands::report_parse_error(app, e);
  } catch (const dsv4::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
