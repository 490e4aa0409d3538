#include "backend/host_staged_communicator.h"

#include "backend/cpu/in_process_communicator.h"

namespace dsv4 {
namespace {

class HostStagedCommunicator final : public Communicator {
 public:
  HostStagedCommunicator(std::unique_ptr<Communicator> host, Backend& backend) : host_(std::move(host)), backend_(backend) {}
  int rank() const override { return host_->rank(); }
  int world_size() const override { return host_->world_size(); }
  bool can_record() const override { return false; }

  void all_reduce_sum(Tensor& x) override {
    Staged s = stage(x);
    host_->all_reduce_sum(s.tensor);
    backend_.upload(x, s.bytes.data());
  }
  void all_gather(const Tensor& x, Tensor& out) override {
    Staged in = stage(x);
    Staged o{std::vector<uint8_t>(out.nbytes()), out};
    o.tensor.data = o.bytes.data();
    host_->all_gather(in.tensor, o.tensor);
    backend_.upload(out, o.bytes.data());
  }
  void broadcast(Tensor& x, int root) override {
    Staged s = stage(x);
    host_->broadcast(s.tensor, root);
    backend_.upload(x, s.bytes.data());
  }

 private:
  struct Staged {
    std::vector<uint8_t> bytes;
    Tensor tensor;  // x's dtype and shape over `bytes`
  };
  Staged stage(const Tensor& x) {
    Staged s{std::vector<uint8_t>(x.nbytes()), x};
    backend_.to_host(x, s.bytes.data());
    s.tensor.storage = nullptr;
    s.tensor.data = s.bytes.data();
    return s;
  }

  std::unique_ptr<Communicator> host_;
  Backend& backend_;
};

}  // namespace

CommunicatorGroup make_host_staged_group(const std::vector<Backend*>& backends) {
  CommunicatorGroup group = make_in_process_group(int(backends.size()));
  for (size_t r = 0; r < backends.size(); ++r)
    group.ranks[r] = std::make_unique<HostStagedCommunicator>(std::move(group.ranks[r]), *backends[r]);
  return group;
}

}  // namespace dsv4
