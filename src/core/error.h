// One exception type for every user-facing failure: the message is the whole story (file,
// tensor, expectation), printed as one line by the command that catches it.
#pragma once
#include <fmt/core.h>
#include <stdexcept>
#include <string>

namespace dsv4 {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

#define DSV4_CHECK(cond, ...) \
  do { if (!(cond)) ::dsv4::fail(__VA_ARGS__); } while (0)

}  // namespace dsv4
