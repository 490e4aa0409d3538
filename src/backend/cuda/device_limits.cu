// current_device_limits(): the CUDA runtime's answers for the current device.
#include "backend/cuda/device_limits.h"

#include "backend/cuda/cuda_utils.h"

namespace dsv4::cuda {
namespace {

// Empty: only its binary version is read (90 = this build's sm_90a code runs on the device).
__global__ void sm90a_probe_kernel() {}

DeviceLimits read_limits(int device) {
  auto attr = [device](cudaDeviceAttr a) {
    int v = 0;
    DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&v, a, device));
    return v;
  };
  DeviceLimits l;
  l.cc_major = attr(cudaDevAttrComputeCapabilityMajor);
  l.cc_minor = attr(cudaDevAttrComputeCapabilityMinor);
  l.smem_per_block_optin = size_t(attr(cudaDevAttrMaxSharedMemoryPerBlockOptin));
  l.smem_per_sm = size_t(attr(cudaDevAttrMaxSharedMemoryPerMultiprocessor));
  l.reserved_smem_per_block = size_t(attr(cudaDevAttrReservedSharedMemoryPerBlock));
  l.sms = attr(cudaDevAttrMultiProcessorCount);
  l.regs_per_sm = attr(cudaDevAttrMaxRegistersPerMultiprocessor);
  l.sm90a_code = runs_sm90a_code(sm90a_probe_kernel);
  return l;
}

}  // namespace

DeviceLimits current_device_limits() {
  // Read once, like the SM counts the launches cache: the backend uses one device per process.
  static const DeviceLimits limits = [] {
    int device = 0;
    DSV4_CUDA_CHECK(cudaGetDevice(&device));
    return read_limits(device);
  }();
  return limits;
}

}  // namespace dsv4::cuda
