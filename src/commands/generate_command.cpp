// `dsv4 generate`: one prompt, the output streamed to stdout as it is produced (stats on stderr),
// or one JSON result with --json.
#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "commands/cli_options.h"
#include "commands/commands.h"
#include "commands/generation.h"
#include "commands/golden_commands.h"
#include "commands/terminal.h"
#include "core/error.h"
#include "core/log.h"
#include "serve/chat_format.h"
#include "serve/tokenizer.h"

namespace dsv4::commands {

namespace fs = std::filesystem;

namespace {

struct GenerateArgs {
  std::string model, prompt, prompt_ids, system, backend = "cpu";
  SamplingParams sampling;
  GenerationLimits limits;
  bool chat = false, think = false, no_think = false, json = false, print_ids = false;
};

constexpr const char* kIdsFooter =
    "Token ids (--prompt-ids, the output of --ids and --json): non-negative integers separated by one\n"
    "comma or by spaces, optionally inside [ ]. Every id below the model's vocabulary size is valid;\n"
    "ids the tokenizer has no text for (DeepSeek-V4: 128846 to 129279, padding rows of the embedding)\n"
    "are printed in text as <id:N>.\n"
    "Ctrl-C stops the generation after the step in flight and prints what was produced and the stats\n"
    "(exit status 130); a second Ctrl-C ends the process at once.\n";

std::optional<Tokenizer> model_tokenizer(const std::string& dir) {
  if (!fs::exists(fs::path(dir) / "tokenizer.json")) return std::nullopt;
  return Tokenizer::load(dir);
}

std::vector<int32_t> prompt_tokens(const GenerateArgs& a, const CLI::App& cmd, const std::optional<Tokenizer>& tok) {
  if (cmd.count("--prompt-ids")) {
    if (a.chat) usage_error("--chat encodes --prompt text as a conversation; it does not apply to --prompt-ids");
    try {
      return parse_token_ids(a.prompt_ids, "--prompt-ids");
    } catch (const Error& e) {
      usage_error("{}", e.what());
    }
  }
  if (!cmd.count("--prompt")) usage_error("give the prompt: --prompt TEXT or --prompt-ids 1,2,3");
  if (a.prompt.empty()) usage_error("--prompt is empty: give some text (or --prompt-ids)");
  if (!tok) fail("--prompt needs a tokenizer, and {} has no tokenizer.json (give --prompt-ids instead)", a.model);
  if (!a.chat) return tok->encode(a.prompt);
  std::vector<chat::Message> messages;
  if (!a.system.empty()) messages.push_back(make_message("system", a.system));
  messages.push_back(make_message("user", a.prompt));
  chat::EncodeOptions options;
  options.thinking_mode = a.think ? chat::ThinkingMode::Thinking : chat::ThinkingMode::Chat;
  return tok->encode(chat::encode_messages(messages, options));
}

void run_generate(const GenerateArgs& a, const CLI::App& cmd) {
  check_model_dir(a.model);
  if (cmd.count("--system") && !a.chat) usage_error("--system needs --chat");
  const std::optional<Tokenizer> tok = model_tokenizer(a.model);
  const std::vector<int32_t> prompt = prompt_tokens(a, cmd, tok);
  const bool text_out = tok && !a.print_ids;
  if (!tok && !a.print_ids && !a.json) log_info("{} has no tokenizer.json: printing token ids", a.model);

  LoadedModel m = load_model(a.model, a.backend);
  ModelSequence sequence(*m.model);
  const int32_t eos = m.model->config().eos_token_id;
  std::optional<chat::ThinkingMode> mode;
  if (a.chat) mode = a.think ? chat::ThinkingMode::Thinking : chat::ThinkingMode::Chat;
  std::optional<TokenTextStream> text;
  if (tok) text.emplace(*tok, mode);

  // Streamed output: the answer on stdout, the reasoning (--chat --think) on stderr, dimmed.
  std::string content, reasoning;
  bool wrote_id = false, in_reasoning = false;
  auto show = [&](chat::OutputDelta d) {
    reasoning += d.reasoning_content;
    content += d.content;
    if (a.json || !text_out) return;
    if (!d.reasoning_content.empty()) {
      write_now(stderr, dim(stderr, d.reasoning_content));
      in_reasoning = true;
    }
    if (d.content.empty()) return;
    if (in_reasoning) write_now(stderr, "\n\n");  // the answer below the reasoning
    in_reasoning = false;
    write_now(stdout, d.content);
  };
  PrefillProgress progress;
  GenerationCallbacks callbacks;
  callbacks.on_prefill = [&](int64_t done, int64_t total) { progress.update(done, total); };
  callbacks.on_token = [&](int32_t id) {
    progress.clear();
    if (!a.json && !text_out) {
      write_now(stdout, fmt::format("{}{}", wrote_id ? "," : "", id));
      wrote_id = true;
    }
    if (text && (id != eos || a.limits.ignore_eos)) show(text->push(id));
  };
  InterruptGuard interrupt;
  GenerationResult r = sequence.generate(prompt, a.sampling, a.limits, callbacks, &interrupt);
  progress.clear();
  if (text) show(text->finish());

  if (a.json) {
    nlohmann::ordered_json j;
    j["ids"] = r.tokens;
    if (tok && a.chat) {
      j["reasoning_content"] = reasoning;
      j["content"] = content;
    } else if (tok) {
      j["text"] = content;
    }
    j["finish_reason"] = stop_reason_name(r.reason);
    j["prompt_tokens"] = prompt.size();
    j["completion_tokens"] = r.tokens.size();
    j["prefill_seconds"] = r.prefill_seconds;
    j["prefill_tokens_per_second"] = r.prefill_rate();
    j["decode_seconds"] = r.decode_seconds;
    j["decode_tokens_per_second"] = r.decode_rate();
    write_now(stdout, j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  } else if (!text_out) {
    write_now(stdout, "\n");
  } else if (is_terminal(stdout) && !content.empty() && content.back() != '\n') {
    write_now(stdout, "\n");  // the shell prompt on a line of its own
  }
  if (in_reasoning) write_now(stderr, "\n");
  log_info("{}", stats_line(r));
  log_info("{}", stop_line(r, a.limits.max_tokens));
  if (r.reason == StopReason::Interrupted) throw CLI::RuntimeError(kExitInterrupted);
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Generate text from a prompt, streamed to stdout as it is produced (stats on stderr)");
  auto a = std::make_shared<GenerateArgs>();
  add_model_option(cmd, a->model);
  auto* ids = cmd->add_option("--prompt-ids", a->prompt_ids, "Prompt token ids, e.g. 1,2,3 (see below)");
  cmd->add_option("--prompt", a->prompt, "Prompt text (needs tokenizer.json in the model directory)")->excludes(ids);
  auto* chat = cmd->add_flag("--chat", a->chat, "Encode --prompt as a user turn of a DeepSeek-V4 conversation (the chat template)");
  cmd->add_option("--system", a->system, "With --chat: a system message before the prompt");
  auto* think = cmd->add_flag("--think", a->think, "With --chat: thinking mode (the reasoning goes to stderr, the answer to stdout)");
  auto* no_think = cmd->add_flag("--no-think", a->no_think, "With --chat: answer directly, no reasoning (the default)");
  no_think->excludes(think);
  think->needs(chat);
  no_think->needs(chat);
  cmd->add_option("-n,--max-tokens", a->limits.max_tokens, "Tokens to generate at most")
      ->check(integer_in(1, int64_t(1) << 30))
      ->capture_default_str();
  add_sampling_options(cmd, a->sampling);
  cmd->add_flag("--ignore-eos", a->limits.ignore_eos, "Keep generating after the end-of-sequence token");
  cmd->add_option("--prefill-chunk", a->limits.prefill_chunk, "Prompt tokens per prefill step (progress and Ctrl-C between steps)")
      ->check(integer_in(1, int64_t(1) << 24))
      ->capture_default_str();
  cmd->add_flag("--ids", a->print_ids, "Print the generated token ids (comma-separated) instead of the text");
  cmd->add_flag("--json", a->json, "Print one JSON object at the end (ids, text, finish_reason, token counts, timings)")
      ->excludes("--ids");
  add_backend_option(cmd, a->backend);
  cmd->footer(kIdsFooter);
  cmd->callback([a, cmd] { run_generate(*a, *cmd); });
}

}  // namespace dsv4::commands
