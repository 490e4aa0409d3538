#include "commands/terminal.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "core/log.h"

namespace dsv4::commands {

namespace {

bool styled(std::FILE* stream) {
  const char* term = std::getenv("TERM");
  return is_terminal(stream) && !(term && std::strcmp(term, "dumb") == 0) && !std::getenv("NO_COLOR");
}

}  // namespace

bool is_terminal(std::FILE* stream) { return ::isatty(fileno(stream)) == 1; }

void write_now(std::FILE* stream, std::string_view text) {
  if (!text.empty()) std::fwrite(text.data(), 1, text.size(), stream);
  std::fflush(stream);
}

std::string dim(std::FILE* stream, std::string_view text) {
  return styled(stream) ? fmt::format("\033[2m{}\033[0m", text) : std::string(text);
}

std::string bold(std::FILE* stream, std::string_view text) {
  return styled(stream) ? fmt::format("\033[1m{}\033[0m", text) : std::string(text);
}

PrefillProgress::PrefillProgress()
    : active_(log_level() >= LogLevel::Info && is_terminal(stderr)), start_(std::chrono::steady_clock::now()) {}

void PrefillProgress::update(int64_t done, int64_t total) {
  if (!active_ || (done == total && !shown_)) return;  // a one-chunk prompt shows nothing
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = seconds > 0 ? double(done) / seconds : 0;
  const int width = 30, filled = total > 0 ? int(double(width) * double(done) / double(total)) : width;
  const std::string left = rate > 0 ? fmt::format(", {:.0f} s left", double(total - done) / rate) : "";
  fmt::print(stderr, "\r\033[K  prefill [{:<{}}] {}/{} tokens, {:.1f} tok/s{}", std::string(size_t(filled), '#'), width, done,
             total, rate, left);
  std::fflush(stderr);
  shown_ = true;
}

void PrefillProgress::clear() {
  if (shown_) write_now(stderr, "\r\033[K");
  shown_ = false;
}

std::string stats_line(const GenerationResult& r) {
  std::string reused = r.reused_tokens ? fmt::format(" (+{} cached)", r.reused_tokens) : "";
  return fmt::format("prefill: {} tokens{} in {:.3f} s ({:.1f} tok/s); decode: {} tokens in {:.3f} s ({:.1f} tok/s)",
                     r.prompt_tokens, reused, r.prefill_seconds, r.prefill_rate(), r.tokens.size(), r.decode_seconds,
                     r.decode_rate());
}

std::string stop_line(const GenerationResult& r, int64_t max_tokens) {
  switch (r.reason) {
    case StopReason::Eos: return "stopped at the end-of-sequence token";
    case StopReason::Interrupted:
      return r.tokens.empty() ? fmt::format("stopped by Ctrl-C during the prefill ({} prompt tokens run)", r.prompt_tokens)
                              : fmt::format("stopped by Ctrl-C after {} tokens", r.tokens.size());
    case StopReason::Length:
      return int64_t(r.tokens.size()) >= max_tokens ? fmt::format("stopped after {} tokens (--max-tokens)", r.tokens.size())
                                                    : fmt::format("stopped at the context length, after {} tokens", r.tokens.size());
  }
  return "";
}

}  // namespace dsv4::commands
