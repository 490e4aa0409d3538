// `dsv4 chat`: an interactive conversation in the terminal. Each turn encodes the whole
// conversation with the DeepSeek-V4 chat format and generates on one model sequence, which keeps
// its cache when the new prompt extends what it holds (the previous turn's prompt and reply), so
// a turn usually runs only its new tokens. Reasoning (thinking mode) is shown dimmed, apart from
// the answer; the oldest turns are dropped when the conversation outgrows the context.
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
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

struct ChatArgs {
  std::string model, system, backend = "cpu";
  SamplingParams sampling;
  GenerationLimits limits{.max_tokens = 2048};
  int64_t context = 0;
  bool think = false;
};

constexpr const char* kChatHelp =
    "/reset          forget the conversation\n"
    "/think on|off   thinking mode: reason first (shown dimmed), then answer\n"
    "/stats          the last reply's speed and the conversation's size\n"
    "/help           this list\n"
    "/exit           quit (or Ctrl-D)\n"
    "Ctrl-C stops a reply and keeps what it said.";

enum class Input { Line, End, Interrupted };

class ChatSession {
 public:
  ChatSession(const ChatArgs& args, Dsv4Model& model, const Tokenizer& tokenizer)
      : args_(args), model_(model), tokenizer_(tokenizer), sequence_(model), think_(args.think) {
    const int64_t model_length = model.config().max_position_embeddings;
    context_ = args.context > 0 ? std::min(args.context, model_length) : model_length;
    if (args.limits.max_tokens >= context_)
      fail("--max-tokens {} leaves no room for a message in a context of {} tokens", args.limits.max_tokens, context_);
  }

  void run() {
    write_now(stdout, fmt::format("dsv4 chat: {} (context {} tokens, thinking {}). /help lists the commands; Ctrl-C stops a "
                                  "reply, Ctrl-D or /exit quits.\n",
                                  args_.model, context_, think_ ? "on" : "off"));
    std::string line;
    while (true) {
      write_now(stdout, bold(stdout, "> "));
      const Input got = read_line(line);
      if (got == Input::Interrupted) {
        interrupt_.rearm();
        write_now(stdout, "\n(Ctrl-D or /exit quits)\n");
        continue;
      }
      if (got == Input::End && line.empty()) break;
      const size_t first = line.find_first_not_of(" \t\r");
      if (first == std::string::npos) continue;
      line = line.substr(first, line.find_last_not_of(" \t\r") - first + 1);
      if (line[0] == '/') {
        if (!command(line)) break;
      } else {
        turn(line);
      }
      if (got == Input::End) break;
    }
    write_now(stdout, "\n");
  }

 private:
  Input read_line(std::string& line) {
    line.clear();
    while (true) {
      char c = 0;
      const ssize_t n = ::read(STDIN_FILENO, &c, 1);
      if (n == 1) {
        if (c == '\n') return Input::Line;
        line += c;
      } else if (n == 0) {
        return Input::End;
      } else if (errno != EINTR) {
        return Input::End;
      } else if (interrupt_.raised()) {
        return Input::Interrupted;
      }
    }
  }

  // False to quit.
  bool command(const std::string& line) {
    const size_t space = line.find(' ');
    const std::string name = line.substr(0, space);
    const std::string arg = space == std::string::npos ? "" : line.substr(line.find_first_not_of(' ', space));
    if (name == "/exit" || name == "/quit") return false;
    if (name == "/help") {
      write_now(stdout, fmt::format("{}\n", kChatHelp));
    } else if (name == "/reset") {
      history_.clear();
      sequence_.reset();
      write_now(stdout, "(the conversation is cleared)\n");
    } else if (name == "/think" && (arg == "on" || arg == "off")) {
      think_ = arg == "on";
      write_now(stdout, fmt::format("(thinking {})\n", arg));
    } else if (name == "/think") {
      write_now(stdout, fmt::format("(thinking is {}; /think on or /think off changes it)\n", think_ ? "on" : "off"));
    } else if (name == "/stats") {
      write_now(stdout, stats());
    } else {
      write_now(stdout, fmt::format("unknown command {} (/help lists the commands)\n", name));
    }
    return true;
  }

  std::string stats() const {
    std::string text;
    if (last_)
      text += fmt::format("last reply: {}; {}\n", stats_line(*last_), stop_line(*last_, args_.limits.max_tokens));
    else
      text += "no reply yet\n";
    const size_t turns = history_.size() / 2;
    return text + fmt::format("conversation: {} turn{}, {} of {} context tokens in the cache, thinking {}\n", turns,
                              turns == 1 ? "" : "s", sequence_.cached().size(), context_, think_ ? "on" : "off");
  }

  std::vector<int32_t> encode() const {
    std::vector<chat::Message> messages;
    if (!args_.system.empty()) messages.push_back(make_message("system", args_.system));
    messages.insert(messages.end(), history_.begin(), history_.end());
    chat::EncodeOptions options;
    options.thinking_mode = think_ ? chat::ThinkingMode::Thinking : chat::ThinkingMode::Chat;
    return tokenizer_.encode(chat::encode_messages(messages, options));
  }

  // The conversation's prompt with room for a whole reply, dropping the oldest turns if needed.
  std::optional<std::vector<int32_t>> fitted_prompt() {
    std::vector<int32_t> prompt = encode();
    size_t dropped = 0;
    while (int64_t(prompt.size()) + args_.limits.max_tokens > context_ && history_.size() > 1) {
      history_.erase(history_.begin(), history_.begin() + 2);  // a user turn and its reply
      ++dropped;
      prompt = encode();
    }
    if (dropped == 1)
      write_now(stdout, dim(stdout, fmt::format("(the oldest turn was dropped to fit the context of {} tokens)\n", context_)));
    else if (dropped > 1)
      write_now(stdout, dim(stdout, fmt::format("(the {} oldest turns were dropped to fit the context of {} tokens)\n", dropped,
                                                context_)));
    if (int64_t(prompt.size()) + args_.limits.max_tokens <= context_) return prompt;
    write_now(stdout, fmt::format("(this message is too long: {} tokens, and a reply of up to {} does not fit the context of {})\n",
                                  prompt.size(), args_.limits.max_tokens, context_));
    history_.clear();
    return std::nullopt;
  }

  void turn(const std::string& text) {
    history_.push_back(make_message("user", text));
    const std::optional<std::vector<int32_t>> prompt = fitted_prompt();
    if (!prompt) return;
    const auto mode = think_ ? chat::ThinkingMode::Thinking : chat::ThinkingMode::Chat;
    TokenTextStream stream(tokenizer_, mode);
    std::string content, reasoning;
    bool in_reasoning = false;
    auto show = [&](chat::OutputDelta d) {
      if (!d.reasoning_content.empty()) {
        if (reasoning.empty()) write_now(stdout, dim(stdout, "thinking: "));
        write_now(stdout, dim(stdout, d.reasoning_content));
        reasoning += d.reasoning_content;
        in_reasoning = true;
      }
      if (d.content.empty()) return;
      if (in_reasoning) write_now(stdout, "\n\n");
      in_reasoning = false;
      write_now(stdout, d.content);
      content += d.content;
    };
    PrefillProgress progress;
    GenerationCallbacks callbacks;
    const int32_t eos = model_.config().eos_token_id;
    callbacks.on_prefill = [&](int64_t done, int64_t total) { progress.update(done, total); };
    callbacks.on_token = [&](int32_t id) {
      progress.clear();
      if (id != eos) show(stream.push(id));
    };
    GenerationLimits limits = args_.limits;
    limits.max_positions = context_;
    try {
      last_ = sequence_.generate(*prompt, args_.sampling, limits, callbacks, &interrupt_);
    } catch (const Error& e) {
      progress.clear();
      sequence_.reset();  // a failed step may have left the cache half-written
      history_.pop_back();
      write_now(stdout, "\n");
      fmt::print(stderr, "error: {}\n", e.what());
      return;
    }
    progress.clear();
    show(stream.finish());
    const bool stopped = last_->reason == StopReason::Interrupted;
    if (stopped) interrupt_.rearm();
    if (stopped && last_->tokens.empty()) {
      history_.pop_back();  // nothing was answered: the message is left out
      write_now(stdout, dim(stdout, "[interrupted before the reply began; the message is not kept]\n"));
      return;
    }
    history_.push_back(make_message("assistant", content, reasoning));
    write_now(stdout, stopped ? dim(stdout, "\n[interrupted]\n") : "\n");
  }

  const ChatArgs& args_;
  Dsv4Model& model_;
  const Tokenizer& tokenizer_;
  ModelSequence sequence_;
  InterruptGuard interrupt_;
  bool think_;
  int64_t context_ = 0;
  std::vector<chat::Message> history_;  // user and assistant turns, alternating
  std::optional<GenerationResult> last_;
};

void run_chat(const ChatArgs& args) {
  check_model_dir(args.model);
  if (!fs::exists(fs::path(args.model) / "tokenizer.json"))
    fail("chat needs a tokenizer, and {} has no tokenizer.json", args.model);
  const Tokenizer tokenizer = Tokenizer::load(args.model);
  LoadedModel m = load_model(args.model, args.backend);
  ChatSession session(args, *m.model, tokenizer);
  session.run();
}

}  // namespace

void add_chat_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat", "Chat with the model in the terminal (multi-turn, streamed, DeepSeek-V4 chat format)");
  auto a = std::make_shared<ChatArgs>();
  add_model_option(cmd, a->model);
  cmd->add_option("--system", a->system, "A system message at the start of the conversation");
  cmd->add_flag("--think,!--no-think", a->think, "Start in thinking mode (/think on|off changes it; default off)");
  cmd->add_option("-n,--max-tokens", a->limits.max_tokens, "Tokens per reply at most")
      ->check(integer_in(1, int64_t(1) << 30))
      ->capture_default_str();
  cmd->add_option("--context", a->context, "Context length in tokens: older turns are dropped to stay within it (0: the model's)")
      ->check(integer_in(0, int64_t(1) << 40, "0 = the model's max_position_embeddings"))
      ->capture_default_str();
  add_sampling_options(cmd, a->sampling);
  cmd->add_option("--prefill-chunk", a->limits.prefill_chunk, "Prompt tokens per prefill step (progress and Ctrl-C between steps)")
      ->check(integer_in(1, int64_t(1) << 24))
      ->capture_default_str();
  add_backend_option(cmd, a->backend);
  cmd->footer(fmt::format("In the chat:\n{}\n", kChatHelp));
  cmd->callback([a] { run_chat(*a); });
}

}  // namespace dsv4::commands
