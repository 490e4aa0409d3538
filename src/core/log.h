// The only global mutable state: the log level. Messages go to stderr so stdout stays data.
#pragma once
#include <fmt/core.h>
#include <cstdint>
#include <cstdio>

namespace dsv4 {

enum class LogLevel { Quiet = 0, Info = 1, Debug = 2 };
LogLevel& log_level();

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() >= LogLevel::Info) fmt::print(stderr, "{}\n", fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() >= LogLevel::Debug) fmt::print(stderr, "{}\n", fmt::format(f, std::forward<Args>(args)...));
}

// A progress line on a terminal (stderr a TTY, log level Info): `\r`-rewritten, ended by done().
// Silent when stderr is a file, so logs stay one line per event.
class Progress {
 public:
  explicit Progress(const char* what);
  void update(int64_t done, int64_t total, double bytes);
  void done();

 private:
  const char* what_;
  bool active_;
  double start_;
};

}  // namespace dsv4
