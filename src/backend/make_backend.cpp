// make_backend, in a file of its own: only what names a backend by string links every backend.
#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#if DSV4_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.h"
#endif

namespace dsv4 {

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "cpu") return std::make_unique<CpuBackend>();
  if (name == "cuda") {
#if DSV4_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      (void)cudaGetLastError();
      fail("--backend cuda: no CUDA device is visible (use --backend cpu)");
    }
    return std::make_unique<cuda::CudaBackend>();
#else
    fail("--backend cuda: this build has no CUDA backend (configure with -DDSV4_CUDA=ON on a machine with nvcc)");
#endif
  }
  fail("unknown backend '{}' (cpu or cuda)", name);
}

}  // namespace dsv4
