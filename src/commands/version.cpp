// `dsv4 --version`.
#include <fmt/format.h>

#include "commands/build_info.h"
#include "commands/commands.h"

namespace dsv4::commands {

std::string version_text() {
  const BuildInfo& b = build_info();
  std::string text = fmt::format("dsv4 {}\ncommit: {}\nbuild: {}, {}", b.version, b.commit, b.build_type, b.compiler);
  if (*b.cxx_flags) text += fmt::format(", flags {}", b.cxx_flags);
  if (*b.cuda_compiler)
    text += fmt::format("\ncuda backend: {}, architectures {}", b.cuda_compiler, b.cuda_archs);
  else
    text += "\ncuda backend: not built (configured with DSV4_CUDA=OFF or without nvcc)";
  return text;
}

}  // namespace dsv4::commands
