// make_backend, in a file of its own: only what names a backend by string links every backend.
#include "backend/backend.h"

#include "backend/communicator.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/in_process_communicator.h"
#include "backend/host_staged_communicator.h"
#include "core/error.h"
#include "core/log.h"
#include <set>

#if DSV4_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/nccl_communicator.h"
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

std::unique_ptr<Backend> make_backend(const std::string& name, int device) {
  if (name == "cpu") return std::make_unique<CpuBackend>();
  if (name == "cuda") {
    const std::string why = cuda_unavailable_reason();
    if (!why.empty()) fail("--backend cuda: {}; use --backend cpu", why);
#if DSV4_HAVE_CUDA
    int n = 0;
    DSV4_CUDA_CHECK(cudaGetDeviceCount(&n));
    if (device >= n) fail("--backend cuda: GPU {} is needed and {} {} visible", device, n, n == 1 ? "is" : "are");
    return std::make_unique<cuda::CudaBackend>(device);
#endif
  }
  fail("unknown backend '{}' (cpu or cuda)", name);
}

CommunicatorGroup make_communicator_group(const std::vector<Backend*>& backends) {
  DSV4_CHECK(!backends.empty(), "a communicator group needs at least one rank");
  if (dynamic_cast<CpuBackend*>(backends[0])) {
    for (Backend* b : backends) DSV4_CHECK(dynamic_cast<CpuBackend*>(b), "a communicator group of mixed backends");
    return make_in_process_group(int(backends.size()));
  }
#if DSV4_HAVE_CUDA
  std::vector<cuda::CudaBackend*> gpus;
  for (Backend* b : backends) {
    auto* g = dynamic_cast<cuda::CudaBackend*>(b);
    DSV4_CHECK(g, "a communicator group of mixed backends");
    gpus.push_back(g);
  }
  std::set<int> devices;
  for (const cuda::CudaBackend* g : gpus) devices.insert(g->device());
  if (devices.size() < gpus.size()) {
    log_info("warning: tensor-parallel ranks share a GPU: collectives pass through host memory and decode steps are not recorded "
             "(for tests; give each rank its own GPU to measure)");
    return make_host_staged_group(backends);
  }
  return cuda::make_nccl_group(gpus);
#else
  fail("no communicator for the {} backend", backends[0]->name());
#endif
}

}  // namespace dsv4
