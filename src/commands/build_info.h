// What this binary is: version, commit and build configuration (build_info.cpp is generated at
// build time from build_info.cpp.in).
#pragma once

namespace dsv4::commands {

struct BuildInfo {
  const char* version;        // "0.1.0"
  const char* commit;         // short hash, "... with uncommitted changes" for a modified tree
  const char* build_type;     // CMAKE_BUILD_TYPE
  const char* compiler;       // "GNU 12.2.0"
  const char* cxx_flags;      // CMAKE_CXX_FLAGS and those of the build type
  const char* cuda_compiler;  // "" without the CUDA backend, else "NVIDIA 12.8.93"
  const char* cuda_archs;     // CMAKE_CUDA_ARCHITECTURES, "" without CUDA
};
const BuildInfo& build_info();

}  // namespace dsv4::commands
