// Terminal output of the generating commands: text written as it comes, a prefill progress line
// on stderr when it is a terminal, the stats line, and reasoning styled apart from the answer.
#pragma once
#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>

#include "commands/generation.h"

namespace dsv4::commands {

bool is_terminal(std::FILE* stream);
// Writes and flushes at once (a token's text must not wait in a buffer).
void write_now(std::FILE* stream, std::string_view text);

// Text styles, applied only when `stream` is a terminal (and TERM is not "dumb").
std::string dim(std::FILE* stream, std::string_view text);
std::string bold(std::FILE* stream, std::string_view text);

// "\r  prefill [#####     ] 4096/18765 tokens, 812 tok/s, 18 s left" on stderr, rewritten after
// each chunk; only on a terminal at the Info log level, and only for prompts long enough to need
// it (more than one chunk). clear() removes the line.
class PrefillProgress {
 public:
  PrefillProgress();
  ~PrefillProgress() { clear(); }
  void update(int64_t done, int64_t total);
  void clear();

 private:
  bool active_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point start_;
};

// "prefill: 5 tokens in 0.012 s (410.2 tok/s); decode: 8 tokens in 0.050 s (140.0 tok/s)"
std::string stats_line(const GenerationResult& r);
// Why generation ended, e.g. "stopped at the end-of-sequence token", "stopped by Ctrl-C after 3 tokens".
std::string stop_line(const GenerationResult& r, int64_t max_tokens);

}  // namespace dsv4::commands
