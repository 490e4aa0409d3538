// The Communicator of a tensor-parallel model on GPUs: NCCL, one communicator per rank (one GPU
// each, ranks being threads of this process), every collective enqueued on the rank's CudaBackend
// stream after the work that produced its input, so a recorded decode step contains it.
//
// NCCL is opened at run time (dlopen of libnccl.so.2): the build needs only the toolkit's nccl.h,
// and a machine without the library runs everything but a split model on GPUs, and says so.
// Where it is looked for, in order: $DSV4_NCCL_LIBRARY (a path), the loader's search path
// (LD_LIBRARY_PATH, ldconfig), the CUDA toolkit's library folder of the build.
//
// NCCL_NVLS_ENABLE (NVLink multicast) defaults to 0 and NCCL_RUNTIME_CONNECT to 0 (every
// connection made at init, none inside a CUDA-graph recording); either stays as the environment
// sets it.
#pragma once
#include <string>
#include <vector>

#include "backend/communicator.h"

namespace dsv4::cuda {

class CudaBackend;

// Why NCCL cannot be used here ("" when it can): the library is missing, or too old.
std::string nccl_unavailable_reason();
// NCCL's version as "2.28.3" (fails where nccl_unavailable_reason() is not empty).
std::string nccl_version();

// One communicator per backend, rank r on backends[r] (each on its own GPU: CudaBackend::device()).
// abort() makes every rank's pending and next collectives fail (CollectiveAborted); reset() builds
// the communicators again.
CommunicatorGroup make_nccl_group(const std::vector<CudaBackend*>& backends);

}  // namespace dsv4::cuda
