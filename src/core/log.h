// The only global mutable state: the log level. Messages go to stderr so stdout stays data.
#pragma once
#include <fmt/core.h>
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

}  // namespace dsv4
