// make_backend, in a file of its own: only what names a backend by string links every backend.
#include "backend/backend.h"

#include "backend/communicator.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/in_process_communicator.h"
#include "core/error.h"
#if DSV4_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.h"
#endif

namespace dsv4 {

std::string cuda_unavailable_reason() {
#if DSV4_HAVE_CUDA
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no CUDA device is visible (") + cudaGetErrorString(err) + ")";
  }
  if (n == 0) return "no CUDA device is visible";
  return "";
#else
  return "this build has no CUDA backend (configure with -DDSV4_CUDA=ON on a machine with nvcc)";
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "cpu") return std::make_unique<CpuBackend>();
  if (name == "cuda") {
    const std::string why = cuda_unavailable_reason();
    if (!why.empty()) fail("--backend cuda: {}; use --backend cpu", why);
#if DSV4_HAVE_CUDA
    return std::make_unique<cuda::CudaBackend>();
#endif
  }
  fail("unknown backend '{}' (cpu or cuda)", name);
}

CommunicatorGroup make_communicator_group(const std::string& backend_name, int world) {
  if (backend_name == "cpu") return make_in_process_group(world);
  // NCCL (one communicator per GPU, collectives on each CudaBackend's stream) is the CUDA twin.
  if (backend_name == "cuda") {
    const std::string why = cuda_unavailable_reason();
    if (!why.empty()) fail("--backend cuda: {}; use --backend cpu", why);
    fail("tensor parallelism on the CUDA backend needs the NCCL communicator, not built yet; use --backend cpu");
  }
  fail("unknown backend '{}' (cpu or cuda)", backend_name);
}

}  // namespace dsv4
