// Collectives between ranks that are threads of one process, each with its own CpuBackend (whose
// tensors are host memory): what CI runs a tensor-parallel model on. The ranks meet at barriers
// and read each other's tensors in place; an all-reduce adds in rank order, each element computed
// once by one rank and written to every rank, so all ranks hold the identical bits.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/communicator.h"

namespace dsv4 {

// What the ranks of one group share. A rank that fails outside a collective calls abort(), so the
// others do not wait for it forever: every rank in (or entering) a collective then throws, until
// reset() once they all left.
class InProcessGroup {
 public:
  explicit InProcessGroup(int world_size);
  int world_size() const { return world_; }
  void abort();
  void reset();

 private:
  friend class InProcessCommunicator;
  enum class Kind { AllReduce, AllGather, Broadcast };
  struct Slot {
    Kind kind = Kind::AllReduce;
    DType dtype = DType::F32;
    int64_t numel = 0;
    int root = 0;
    void* data = nullptr;  // the rank's tensor (in place), or its input
    void* out = nullptr;   // all_gather's output
  };
  // Every rank publishes its slot, then waits for all; the last to arrive releases the others.
  void barrier();
  // After the first barrier: all ranks called the same collective on the same shapes.
  void check_slots(int rank) const;

  const int world_;
  std::mutex mutex_;
  std::condition_variable released_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::vector<Slot> slots_;
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<InProcessGroup> group, int rank);
  int rank() const override { return rank_; }
  int world_size() const override { return group_->world_size(); }
  void all_reduce_sum(Tensor& x) override;
  void all_gather(const Tensor& x, Tensor& out) override;
  void broadcast(Tensor& x, int root) override;

 private:
  std::shared_ptr<InProcessGroup> group_;
  int rank_;
};

// One communicator per rank of a new group of `world_size` threads.
CommunicatorGroup make_in_process_group(int world_size);

}  // namespace dsv4
