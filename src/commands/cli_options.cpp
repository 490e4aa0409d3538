#include "commands/cli_options.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <thread>

#include "checkpoint/model_config.h"
#include "core/error.h"
#include "model/parallel_layout.h"
#include "model/synthetic.h"
#include "serve/tokenizer.h"

namespace dsv4::commands {

namespace fs = std::filesystem;

namespace {

// 1073741824 reads better as 2^30.
std::string bound_text(int64_t v) {
  if (v >= 1024 && (v & (v - 1)) == 0) return fmt::format("2^{}", __builtin_ctzll(uint64_t(v)));
  return fmt::format("{}", v);
}

std::string with_meaning(const std::string& range, const std::string& meaning) {
  return meaning.empty() ? range : fmt::format("{} ({})", range, meaning);
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

}  // namespace

int report_parse_error(const CLI::App& app, const CLI::ParseError& e) {
  const std::string kind = e.get_name();
  if (kind == "CallForHelp" || kind == "CallForAllHelp" || kind == "CallForVersion" || kind == "RuntimeError")
    return app.exit(e);
  // The innermost command given, for the help hint.
  const CLI::App* cmd = &app;
  std::string path = "dsv4";
  while (!cmd->get_subcommands().empty()) {
    cmd = cmd->get_subcommands().front();
    path += " " + cmd->get_name();
  }
  if (cmd == &app) {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) names.push_back(sub->get_name());
    const std::vector<std::string> rest = app.remaining();
    if (!rest.empty() && !rest.front().empty() && rest.front()[0] != '-') {
      fmt::print(stderr, "error: '{}' is not a dsv4 command (the commands: {}; see 'dsv4 --help')\n", rest.front(),
                 fmt::join(names, ", "));
      return kExitUsage;
    }
    if (kind == "RequiredError" && rest.empty()) {
      fmt::print(stderr, "error: give a command: {} (see 'dsv4 --help')\n", fmt::join(names, ", "));
      return kExitUsage;
    }
  }
  // An option of dsv4 itself (--threads), given before or after the command, has its help there.
  for (const CLI::Option* option : app.get_options())
    if (std::string_view(e.what()).starts_with(option->get_name() + ":")) path = "dsv4";
  std::string message = e.what();
  // CLI11's sentences start with a capital ("The following argument..."); an acronym (IDS) stays.
  if (message.size() > 1 && std::isupper(static_cast<unsigned char>(message[0])) &&
      std::islower(static_cast<unsigned char>(message[1])))
    message[0] = char(std::tolower(static_cast<unsigned char>(message[0])));
  fmt::print(stderr, "error: {} (see '{} --help')\n", message, path);
  return kExitUsage;
}

CLI::Validator one_of(std::vector<std::string> values) {
  const std::string list = fmt::format("{}", fmt::join(values, ", "));
  return CLI::Validator(
      [values, list](std::string& text) -> std::string {
        if (std::find(values.begin(), values.end(), text) != values.end()) return "";
        return fmt::format("expected one of {}; got '{}'", list, text);
      },
      fmt::format("{{{}}}", fmt::join(values, ",")));
}

CLI::Validator real_in(double lo, double hi, std::string meaning) {
  const std::string range = fmt::format("a number from {} to {}", lo, hi);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double value = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value) || value < lo || value > hi)
          return fmt::format("expected {}, got '{}'", with_meaning(range, meaning), text);
        return "";
      },
      fmt::format("{} to {}", lo, hi));
}

CLI::Validator integer_in(int64_t lo, int64_t hi, std::string meaning) {
  const std::string range = fmt::format("an integer from {} to {}", bound_text(lo), bound_text(hi));
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        int64_t value = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (ec != std::errc() || end != text.data() + text.size() || value < lo || value > hi)
          return fmt::format("expected {}, got '{}'", with_meaning(range, meaning), text);
        return "";
      },
      fmt::format("{} to {}", bound_text(lo), bound_text(hi)));
}

CLI::Validator unsigned_64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t value = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (text.empty() || text[0] == '-' || ec != std::errc() || end != text.data() + text.size())
          return fmt::format("expected an integer from 0 to 2^64 - 1, got '{}'", text);
        return "";
      },
      "0 to 2^64-1");
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max(1u, std::thread::hardware_concurrency());
}

CLI::Option* add_model_option(CLI::App* cmd, std::string& dir) {
  return cmd->add_option("--model", dir, "Checkpoint directory (config.json, safetensors; tokenizer.json for text), or synthetic:flash[,layers=N,experts=nvfp4,seed=K] / synthetic:tiny for random weights of that shape")
      ->required();
}

void check_model_dir(const std::string& dir) {
  if (dir.rfind("synthetic:", 0) == 0) return;  // a generated model (model/synthetic.h), checked as it is built
  std::error_code ec;
  if (!fs::exists(dir, ec)) fail("--model {}: no such directory", dir);
  if (!fs::is_directory(dir, ec)) fail("--model {}: not a directory", dir);
  if (!fs::exists(fs::path(dir) / "config.json", ec))
    fail("--model {}: config.json is missing (not a checkpoint directory)", dir);
}

CLI::Option* add_backend_option(CLI::App* cmd, std::string& backend) {
  return cmd->add_option("--backend", backend, "Compute backend: cpu | cuda")
      ->check(one_of({"cpu", "cuda"}))
      ->capture_default_str();
}

void add_parallel_options(CLI::App* cmd, ParallelOptions& parallel) {
  cmd->add_option("--tensor-parallel-size", parallel.tensor_parallel_size,
                  "Split the model over this many ranks (attention heads, experts), one thread each")
      ->check(integer_in(1, 256, "1 = not split"))
      ->capture_default_str();
  cmd->add_flag("--expert-parallel", parallel.expert_parallel,
                "With --tensor-parallel-size N: give each rank whole routed experts (n_experts / N) instead of a slice of every expert");
}

void check_parallel_options(const std::string& dir, const ParallelOptions& parallel) {
  const int n = parallel.tensor_parallel_size;
  if (parallel.expert_parallel && n == 1) usage_error("--expert-parallel splits the experts over ranks: give --tensor-parallel-size N > 1");
  if (n == 1) return;
  const ModelConfig c = dir.rfind("synthetic:", 0) == 0 ? make_synthetic_source(dir)->config() : load_model_config(dir);
  if (const std::string why = parallel_layout_problem(c, n, parallel.expert_parallel); !why.empty())
    usage_error("--tensor-parallel-size {}: {}", n, why);
}

void add_sampling_options(CLI::App* cmd, SamplingParams& sampling) {
  cmd->add_option("--temperature", sampling.temperature, "Sampling temperature (0 = greedy)")
      ->check(real_in(0, 100, "0 = greedy"))
      ->capture_default_str();
  cmd->add_option("--top-p", sampling.top_p, "Nucleus sampling: keep the most likely tokens up to this mass (1 = off)")
      ->check(real_in(0, 1, "1 = off"))
      ->capture_default_str();
  cmd->add_option("--top-k", sampling.top_k, "Keep the k most likely tokens (0 = off)")
      ->check(integer_in(0, 1 << 24, "0 = off"))
      ->capture_default_str();
  cmd->add_option("--min-p", sampling.min_p, "Drop tokens below min-p times the top probability (0 = off)")
      ->check(real_in(0, 1, "0 = off"))
      ->capture_default_str();
  cmd->add_option("--seed", sampling.seed, "Sampling seed: the same seed gives the same tokens on every backend")
      ->check(unsigned_64())
      ->capture_default_str();
}

std::vector<int32_t> parse_token_ids(std::string_view text, std::string_view what, bool allow_empty) {
  const std::string_view whole = text;
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  if (!text.empty() && text.front() == '[') {
    if (text.back() != ']') fail("{}: '[' without a closing ']' in '{}'", what, whole);
    text = text.substr(1, text.size() - 2);
  }
  std::vector<int32_t> ids;
  bool after_comma = false;  // a comma was the last thing seen: an id must follow
  size_t pos = 0;
  while (pos < text.size()) {
    const char c = text[pos];
    if (is_space(c)) {
      ++pos;
    } else if (c == ',') {
      if (ids.empty() || after_comma)
        fail("{}: an empty item in '{}' (separate ids by one comma or by spaces)", what, whole);
      after_comma = true;
      ++pos;
    } else {
      size_t end = pos;
      while (end < text.size() && !is_space(text[end]) && text[end] != ',') ++end;
      const std::string_view item = text.substr(pos, end - pos);
      int64_t value = 0;
      const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
      if (ec != std::errc() || ptr != item.data() + item.size() || value < 0 || value > INT32_MAX)
        fail("'{}' is not a token id (expected non-negative integers separated by commas)", item);
      ids.push_back(int32_t(value));
      after_comma = false;
      pos = end;
    }
  }
  if (after_comma) fail("{}: '{}' ends with a comma", what, whole);
  if (ids.empty() && !allow_empty) fail("{}: no ids given", what);
  return ids;
}

std::string textless_token_marker(int32_t id) { return fmt::format("<id:{}>", id); }

std::string decode_with_markers(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  std::string text;
  std::vector<int32_t> run;  // known ids waiting to be decoded together (a character may span several)
  for (int32_t id : ids) {
    if (tokenizer.is_known(id)) {
      run.push_back(id);
      continue;
    }
    text += tokenizer.decode(run);
    run.clear();
    text += textless_token_marker(id);
  }
  return text + tokenizer.decode(run);
}

}  // namespace dsv4::commands
