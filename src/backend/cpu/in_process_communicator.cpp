#include "backend/cpu/in_process_communicator.h"

#include <cstring>

#include "core/error.h"

namespace dsv4 {

InProcessGroup::InProcessGroup(int world_size) : world_(world_size), slots_(size_t(world_size)) {
  DSV4_CHECK(world_size >= 1, "a communicator group needs at least one rank, not {}", world_size);
}

void InProcessGroup::abort() {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = true;
  released_.notify_all();
}

void InProcessGroup::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = false;
  arrived_ = 0;
}

void InProcessGroup::barrier() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (aborted_) throw CollectiveAborted("collective abandoned: another rank failed");
  if (++arrived_ == world_) {
    arrived_ = 0;
    ++generation_;
    released_.notify_all();
    return;
  }
  const uint64_t mine = generation_;
  released_.wait(lock, [&] { return generation_ != mine || aborted_; });
  if (generation_ == mine) throw CollectiveAborted("collective abandoned: another rank failed");
}

void InProcessGroup::check_slots(int rank) const {
  const Slot& a = slots_[0];
  for (int r = 1; r < world_; ++r) {
    const Slot& b = slots_[size_t(r)];
    DSV4_CHECK(a.kind == b.kind && a.dtype == b.dtype && a.numel == b.numel && a.root == b.root,
               "collective mismatch seen by rank {}: rank 0 and rank {} called different collectives or shapes ({} vs {} "
               "elements of {} vs {})",
               rank, r, a.numel, b.numel, dtype_name(a.dtype), dtype_name(b.dtype));
  }
}

InProcessCommunicator::InProcessCommunicator(std::shared_ptr<InProcessGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {
  DSV4_CHECK(rank >= 0 && rank < group_->world_size(), "rank {} outside a group of {}", rank, group_->world_size());
}

void InProcessCommunicator::all_reduce_sum(Tensor& x) {
  DSV4_CHECK(x.dtype == DType::F32 || x.dtype == DType::BF16, "all_reduce_sum: {} tensors are not summed (F32 or BF16)",
             dtype_name(x.dtype));
  InProcessGroup& g = *group_;
  const int world = g.world_size();
  if (world == 1) return;
  g.slots_[size_t(rank_)] = {InProcessGroup::Kind::AllReduce, x.dtype, x.numel(), 0, x.data, nullptr};
  g.barrier();
  g.check_slots(rank_);
  // This rank's share of the elements: read on every rank, added in rank order (starting from
  // rank 0's value, so a −0 stays −0 as in a single rank's sum), written to every rank.
  const int64_t n = x.numel(), begin = n * rank_ / world, end = n * (rank_ + 1) / world;
  if (x.dtype == DType::F32) {
    for (int64_t i = begin; i < end; ++i) {
      float s = static_cast<const float*>(g.slots_[0].data)[i];
      for (int r = 1; r < world; ++r) s += static_cast<const float*>(g.slots_[size_t(r)].data)[i];
      for (int r = 0; r < world; ++r) static_cast<float*>(g.slots_[size_t(r)].data)[i] = s;
    }
  } else {
    for (int64_t i = begin; i < end; ++i) {
      float s = bf16_to_f32(static_cast<const uint16_t*>(g.slots_[0].data)[i]);
      for (int r = 1; r < world; ++r) s += bf16_to_f32(static_cast<const uint16_t*>(g.slots_[size_t(r)].data)[i]);
      const uint16_t b = f32_to_bf16(s);
      for (int r = 0; r < world; ++r) static_cast<uint16_t*>(g.slots_[size_t(r)].data)[i] = b;
    }
  }
  g.barrier();  // every share written before any rank reads its x or reuses its slot
}

void InProcessCommunicator::all_gather(const Tensor& x, Tensor& out) {
  InProcessGroup& g = *group_;
  const int world = g.world_size();
  DSV4_CHECK(out.dtype == x.dtype && out.numel() == x.numel() * world, "all_gather: output of {} {} for {} ranks × {} {}",
             out.numel(), dtype_name(out.dtype), world, x.numel(), dtype_name(x.dtype));
  if (world == 1) {
    std::memcpy(out.data, x.data, x.nbytes());
    return;
  }
  g.slots_[size_t(rank_)] = {InProcessGroup::Kind::AllGather, x.dtype, x.numel(), 0, x.data, out.data};
  g.barrier();
  g.check_slots(rank_);
  const size_t bytes = x.nbytes();
  for (int r = 0; r < world; ++r) std::memcpy(static_cast<uint8_t*>(out.data) + size_t(r) * bytes, g.slots_[size_t(r)].data, bytes);
  g.barrier();  // no rank changes its input while another still copies it
}

void InProcessCommunicator::broadcast(Tensor& x, int root) {
  InProcessGroup& g = *group_;
  const int world = g.world_size();
  DSV4_CHECK(root >= 0 && root < world, "broadcast: root {} outside a group of {}", root, world);
  if (world == 1) return;
  g.slots_[size_t(rank_)] = {InProcessGroup::Kind::Broadcast, x.dtype, x.numel(), root, x.data, nullptr};
  g.barrier();
  g.check_slots(rank_);
  if (rank_ != root) std::memcpy(x.data, g.slots_[size_t(root)].data, x.nbytes());
  g.barrier();
}

CommunicatorGroup make_in_process_group(int world_size) {
  auto g = std::make_shared<InProcessGroup>(world_size);
  CommunicatorGroup group;
  for (int r = 0; r < world_size; ++r) group.ranks.push_back(std::make_unique<InProcessCommunicator>(g, r));
  group.abort = [g] { g->abort(); };
  group.reset = [g] { g->reset(); };
  return group;
}

}  // namespace dsv4
