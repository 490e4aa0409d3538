// Collectives between ranks whose tensors live in device memory the ranks cannot exchange directly
// — CUDA ranks sharing one GPU, where NCCL refuses: each collective copies the rank's tensor to the
// host (a synchronisation), runs the in-process collective there, and copies the result back. The
// same sums, in rank order, as the CPU ranks compute. Not recordable (a host copy inside a
// recording is an error), so a model on it runs its decode steps as called; what it is for: testing
// the split model's GPU ops on a machine with one GPU.
#pragma once
#include <memory>
#include <vector>

#include "backend/communicator.h"

namespace dsv4 {

// One communicator per backend, rank r on backends[r]; abort/reset as the in-process group's.
CommunicatorGroup make_host_staged_group(const std::vector<Backend*>& backends);

}  // namespace dsv4
