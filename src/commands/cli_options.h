// What every command shares on its command line: the validators that give each parameter its range
// and a message naming it, the options that name a model, a backend and the sampling, the one
// token-id list syntax, and the rule for ids the tokenizer has no text for.
#pragma once
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backend/sampling_params.h"

namespace dsv4 {
class Tokenizer;
}

namespace dsv4::commands {

// Usage errors (a bad option value) exit with 2, failures while running with 1, a run stopped by
// Ctrl-C with 130 (the shell's 128 + SIGINT) after printing what it had.
inline constexpr int kExitUsage = 2;
inline constexpr int kExitInterrupted = 130;

// What main prints for a command-line error: "error: ..." in the project's words (an unknown
// command is named as such, with the list of commands) and where the help is; returns the exit
// status (kExitUsage; 0 for --help and --version; a command's own status for CLI::RuntimeError).
int report_parse_error(const CLI::App& app, const CLI::ParseError& e);

// A mistake on the command line found by a command while it runs (a missing prompt, options that
// do not go together): reported like the parser's own errors, with the help hint and kExitUsage.
template <typename... Args>
[[noreturn]] void usage_error(fmt::format_string<Args...> f, Args&&... args) {
  throw CLI::ValidationError(fmt::format(f, std::forward<Args>(args)...));
}

// One of `values` ("expected one of cpu, cuda; got 'x'").
CLI::Validator one_of(std::vector<std::string> values);
// A finite real in [lo, hi] ("nan" and "inf" are refused, unlike CLI::Range). `meaning` is
// appended to the message, e.g. "0 = greedy".
CLI::Validator real_in(double lo, double hi, std::string meaning = "");
// A decimal integer in [lo, hi] (no sign wrap-around, no trailing text).
CLI::Validator integer_in(int64_t lo, int64_t hi, std::string meaning = "");
// A decimal integer from 0 to 2^64 - 1 (a seed: "-3" is refused instead of wrapping).
CLI::Validator unsigned_64();
// The CPU cores this process may use (sched affinity), at least 1.
int available_cores();

// --model DIR, required; the directory is checked by check_model_dir when the command runs.
CLI::Option* add_model_option(CLI::App* cmd, std::string& dir);
// Fails with one line naming what is wrong: no such directory, not a directory, no config.json.
void check_model_dir(const std::string& dir);
// --backend cpu|cuda (default cpu).
CLI::Option* add_backend_option(CLI::App* cmd, std::string& backend);
// --tensor-parallel-size N (1 to 256, default 1) and --expert-parallel: one model over N ranks
// (model/tensor_parallel_model.h).
struct ParallelOptions {
  int tensor_parallel_size = 1;
  bool expert_parallel = false;
};
void add_parallel_options(CLI::App* cmd, ParallelOptions& parallel);
// A usage error (exit status 2) where the model at `dir` cannot be split so: a size that does not
// divide its heads, output groups, experts or intermediate size; --expert-parallel without N > 1.
void check_parallel_options(const std::string& dir, const ParallelOptions& parallel);
// --temperature, --top-p, --top-k, --min-p, --seed, each with its default and range.
void add_sampling_options(CLI::App* cmd, SamplingParams& sampling);

// The token-id list syntax of every command: non-negative decimal integers separated by one comma
// and/or whitespace, optionally inside [ ] (a JSON list pastes in as it is). An empty item
// ("1,,2", a leading or trailing comma) is an error, and so is an empty list unless allowed.
// `what` names the input in messages ("--prompt-ids").
std::vector<int32_t> parse_token_ids(std::string_view text, std::string_view what, bool allow_empty = false);

// Ids the model's vocabulary has but the tokenizer does not (DeepSeek-V4: 128,846 to 129,279, the
// embedding's padding rows) are ordinary ids for the model: accepted in prompts, sampled, listed.
// They have no text, so wherever text is printed they appear as the marker "<id:N>" (N the id),
// never silently dropped. Tokenizing the marker does not give the id back.
std::string textless_token_marker(int32_t id);
// Tokenizer::decode with that rule: the text of every known id, the marker for the others.
std::string decode_with_markers(const Tokenizer& tokenizer, const std::vector<int32_t>& ids);
// The ids `detokenize` accepts without a model: those of the tokenizer and, past it, those of
// DeepSeek-V4's vocabulary (129,280).
inline constexpr int32_t kDeepSeekV4VocabSize = 129280;

}  // namespace dsv4::commands
