// A recorded step of the CUDA backend (CudaBackend::end_capture): the graph, its executable form,
// and what the profile asks of it — its items in the order they were recorded, by name.
#pragma once
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "backend/backend.h"

namespace dsv4::cuda {

// "_ZN4dsv44cuda12_GLOBAL__N_111rope_kernelEv…" → "rope_kernel": the demangled name without its
// scopes and parameter list (template arguments stay), as the profile prints kernels.
std::string kernel_display_name(const char* mangled);

struct CudaGraph final : CapturedWork {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  int64_t items() const override;
  std::vector<ItemKind> item_kinds() const override;
  // Each item's name (a kernel's display name; "copy", "set", ... for the others), in the order the
  // recording made them.
  std::vector<std::string> item_names() const;
  ~CudaGraph() override;
};

// Items recorded so far in the graph that `stream` is capturing into (0 when it is not capturing).
int64_t captured_items(cudaStream_t stream);

}  // namespace dsv4::cuda
