// The collectives a tensor-parallel model needs between its ranks (docs/ARCHITECTURE.md "Tensor
// parallelism"). One Communicator per rank, bound to that rank's backend: a collective is
// enqueued on the backend's queue after the work that produced its input, like any op, and reads
// nothing back to the host — so a NCCL implementation (ncclAllReduce / ncclAllGather /
// ncclBroadcast on the backend's stream) fits the same calls and a recorded step may contain them.
// Every rank calls the same collectives in the same order with tensors of the same dtype and shape.
//
// Two implementations: cpu/in_process_communicator (ranks are threads of one process, each with its
// own CpuBackend; what CI runs) and cuda/nccl_communicator (a GPU per rank, collectives on each
// rank's stream).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

namespace dsv4 {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // In place: x becomes the elementwise sum of every rank's x, the same bits on every rank (F32;
  // the in-process one also takes BF16, summed in f32 and rounded once, which NCCL cannot promise).
  // The in-process implementation adds in rank order; NCCL's ring order differs from it, which is
  // why the model reduces f32 only.
  virtual void all_reduce_sum(Tensor& x) = 0;
  // out [world · n, ...] = every rank's x [n, ...] in rank order (same dtype; out preallocated).
  virtual void all_gather(const Tensor& x, Tensor& out) = 0;
  // x on every rank becomes root's x (the step descriptor of a rank-0 scheduler, say).
  virtual void broadcast(Tensor& x, int root) = 0;
  // Whether its collectives may sit in a backend's recorded step (not when they pass through the
  // host: backend/host_staged_communicator.h).
  virtual bool can_record() const { return true; }
};

// What a rank waiting in a collective throws when another rank failed (CommunicatorGroup::abort).
struct CollectiveAborted : Error {
  using Error::Error;
};

// The communicators of one group, one per rank. abort(): a rank that fails outside a collective
// calls it, so the others stop waiting for it (they throw CollectiveAborted); reset() once every
// rank left, before the next collective.
struct CommunicatorGroup {
  std::vector<std::unique_ptr<Communicator>> ranks;
  std::function<void()> abort, reset;
};

// The group of the ranks whose backends these are (rank r on backends[r], all of one kind, each
// driven by its own thread of this process): in-process for CPU backends, NCCL for CUDA ones on
// distinct GPUs, host-staged for CUDA ranks that share a GPU (tests on one GPU).
CommunicatorGroup make_communicator_group(const std::vector<Backend*>& backends);

}  // namespace dsv4
