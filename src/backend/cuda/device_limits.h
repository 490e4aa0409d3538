// The device limits the kernel choices depend on (shared memory per block and per SM, registers,
// SMs, compute capability), as a value: the dispatchers call their choice functions with
// current_device_limits(), and the sm_120 resource test (tests/ops/sm120_resources_test.cpp) calls
// the same functions with kSm120Limits, without a GPU, to list what an RTX PRO 6000 would launch.
// Plain C++ (no CUDA headers), so host-only code and tests can include it.
#pragma once
#include <cstddef>
#include <string>

namespace dsv4::cuda {

struct DeviceLimits {
  int cc_major = 0, cc_minor = 0;
  // Static + dynamic shared memory one block may use (cudaDevAttrMaxSharedMemoryPerBlockOptin), and
  // what an SM has (cudaDevAttrMaxSharedMemoryPerMultiprocessor); the difference is the driver's
  // reservation per block (cudaDevAttrReservedSharedMemoryPerBlock), which the cubin's .nv.shared
  // size of a function includes (cuobjdump's SHARED) but the opt-in limit does not.
  size_t smem_per_block_optin = 0;
  size_t smem_per_sm = 0;
  size_t reserved_smem_per_block = 0;
  int sms = 0;
  int regs_per_sm = 0;
  // The device runs this build's sm_90a code (an sm_90 GPU and a build with sm_90a): the wgmma and
  // W4A8 paths. A choice function requires cc 9.0 as well, so no other GPU takes them whatever this says.
  bool sm90a_code = false;

  bool is_sm90() const { return cc_major == 9 && cc_minor == 0; }
};

// RTX PRO 6000 Blackwell (sm_120): 99 KB per block, 100 KB per SM, 188 SMs.
inline constexpr DeviceLimits kSm120Limits{12, 0, 101376, 102400, 1024, 188, 65536, false};
// H200 (sm_90): 227 KB per block, 228 KB per SM, 132 SMs; the build's sm_90a code runs.
inline constexpr DeviceLimits kSm90Limits{9, 0, 232448, 233472, 1024, 132, 65536, true};

// One kernel a dispatcher may launch: its name as the demangler prints it, from the function's
// unqualified name up to the parameter list ("sparse_mla_decode_kernel<32, 32, 4>"), its block size
// and the dynamic shared memory it is launched with.
struct KernelLaunch {
  std::string kernel;
  int threads = 0;
  size_t dynamic_smem = 0;
};

// The limits of the device current at the first call (read once from the CUDA runtime).
DeviceLimits current_device_limits();

}  // namespace dsv4::cuda
