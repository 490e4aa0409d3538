#include "backend/cuda/nccl_communicator.h"

#include <fmt/format.h>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/log.h"

#if !DSV4_HAVE_NCCL_HEADER
namespace dsv4::cuda {
// Built where the CUDA toolkit had no nccl.h.
std::string nccl_unavailable_reason() { return "this build found no nccl.h in the CUDA toolkit"; }
std::string nccl_version() { fail("tensor parallelism on the CUDA backend needs NCCL: {}", nccl_unavailable_reason()); }
CommunicatorGroup make_nccl_group(const std::vector<CudaBackend*>&) {
  fail("tensor parallelism on the CUDA backend needs NCCL: {}", nccl_unavailable_reason());
}
}  // namespace dsv4::cuda
#else
#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <memory>
#include <mutex>

namespace dsv4::cuda {
namespace {

// The NCCL entry points the communicator calls, resolved from the library opened at run time.
struct NcclLibrary {
  void* handle = nullptr;
  std::string why_not;  // "" when loaded
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGetLastError) last_error = nullptr;
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;

  static const NcclLibrary& get() {
    static const NcclLibrary lib = load();
    return lib;
  }

 private:
  template <typename F>
  bool resolve(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(handle, name));
    if (!f) why_not = fmt::format("the NCCL library has no {}", name);
    return f != nullptr;
  }

  static NcclLibrary load() {
    NcclLibrary lib;
    std::vector<std::string> tried;
    std::string last;
    auto open = [&](const std::string& path) {
      if (lib.handle) return;
      tried.push_back(path);
      lib.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!lib.handle) last = dlerror();
    };
    if (const char* p = std::getenv("DSV4_NCCL_LIBRARY"); p && *p) {
      open(p);
    } else {
      open("libnccl.so.2");
#ifdef DSV4_CUDA_LIBRARY_DIR
      open(std::string(DSV4_CUDA_LIBRARY_DIR) + "/libnccl.so.2");
#endif
    }
    if (!lib.handle) {
      lib.why_not = fmt::format("libnccl.so.2 could not be opened (tried {}; {}): set DSV4_NCCL_LIBRARY to its path or add "
                                "its folder to LD_LIBRARY_PATH",
                                fmt::join(tried, ", "), last);
      return lib;
    }
    if (!(lib.resolve(lib.get_version, "ncclGetVersion") && lib.resolve(lib.error_string, "ncclGetErrorString") &&
          lib.resolve(lib.last_error, "ncclGetLastError") && lib.resolve(lib.comm_init_all, "ncclCommInitAll") &&
          lib.resolve(lib.comm_destroy, "ncclCommDestroy") && lib.resolve(lib.comm_abort, "ncclCommAbort") &&
          lib.resolve(lib.all_reduce, "ncclAllReduce") && lib.resolve(lib.all_gather, "ncclAllGather") &&
          lib.resolve(lib.broadcast, "ncclBroadcast")))
      return lib;
    int version = 0;
    // ncclCommInitAll, the bf16 type and graph-capturable collectives: 2.10 and later.
    if (lib.get_version(&version) != ncclSuccess || version < 21000)
      lib.why_not = fmt::format("NCCL {} is too old (2.10 or later)", version);
    return lib;
  }
};

const NcclLibrary& nccl() {
  const NcclLibrary& lib = NcclLibrary::get();
  if (!lib.why_not.empty()) fail("tensor parallelism on the CUDA backend needs NCCL: {}", lib.why_not);
  return lib;
}

void check(ncclResult_t r, ncclComm_t comm, const char* what) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  const NcclLibrary& lib = nccl();
  const char* detail = comm ? lib.last_error(comm) : nullptr;
  fail("NCCL {}: {}{}{}", what, lib.error_string(r), detail && *detail ? ": " : "", detail ? detail : "");
}

// What the ranks share: the communicators (rebuilt by reset) and the abort flag.
struct NcclGroup {
  std::vector<CudaBackend*> backends;
  std::vector<int> devices;
  std::mutex mu;
  std::vector<ncclComm_t> comms;
  bool aborted = false;

  void init() {
    comms.assign(devices.size(), nullptr);
    check(nccl().comm_init_all(comms.data(), int(devices.size()), devices.data()), nullptr, "ncclCommInitAll");
  }
  ~NcclGroup() {
    for (ncclComm_t c : comms)
      if (c) nccl().comm_destroy(c);
  }
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return int(group_->devices.size()); }

  void all_reduce_sum(Tensor& x) override {
    // NCCL sums bf16 in bf16 at every hop; the interface promises one rounding of an f32 sum.
    DSV4_CHECK(x.dtype == DType::F32, "all_reduce_sum on NCCL: {} tensors are not summed (F32: the model reduces f32 "
               "partials only)", dtype_name(x.dtype));
    ncclComm_t c = comm();
    check(nccl().all_reduce(x.data, x.data, size_t(x.numel()), ncclFloat32, ncclSum, c, stream()), c, "all-reduce");
  }
  void all_gather(const Tensor& x, Tensor& out) override {
    DSV4_CHECK(out.dtype == x.dtype && out.nbytes() == x.nbytes() * size_t(world_size()),
               "all_gather: {} bytes out for {} ranks of {} bytes", out.nbytes(), world_size(), x.nbytes());
    ncclComm_t c = comm();
    check(nccl().all_gather(x.data, out.data, x.nbytes(), ncclUint8, c, stream()), c, "all-gather");
  }
  void broadcast(Tensor& x, int root) override {
    DSV4_CHECK(root >= 0 && root < world_size(), "broadcast from rank {} of {}", root, world_size());
    ncclComm_t c = comm();
    check(nccl().broadcast(x.data, x.data, x.nbytes(), ncclUint8, root, c, stream()), c, "broadcast");
  }

 private:
  ncclComm_t comm() const {
    std::lock_guard<std::mutex> lock(group_->mu);
    if (group_->aborted) throw CollectiveAborted("collective abandoned: another rank failed");
    return group_->comms[size_t(rank_)];
  }
  cudaStream_t stream() const { return group_->backends[size_t(rank_)]->stream(); }

  std::shared_ptr<NcclGroup> group_;
  int rank_;
};

}  // namespace

std::string nccl_unavailable_reason() { return NcclLibrary::get().why_not; }

std::string nccl_version() {
  int v = 0;
  check(nccl().get_version(&v), nullptr, "ncclGetVersion");
  return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}

CommunicatorGroup make_nccl_group(const std::vector<CudaBackend*>& backends) {
  DSV4_CHECK(!backends.empty(), "a communicator group needs at least one rank");
  nccl();  // the clear error first
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  setenv("NCCL_RUNTIME_CONNECT", "0", 0);
  auto group = std::make_shared<NcclGroup>();
  group->backends = backends;
  cudaDeviceProp first{};
  for (size_t r = 0; r < backends.size(); ++r) {
    const int d = backends[r]->device();
    for (int seen : group->devices)
      DSV4_CHECK(seen != d, "tensor-parallel ranks share GPU {}: NCCL needs one GPU per rank", d);
    cudaDeviceProp p{};
    DSV4_CUDA_CHECK(cudaGetDeviceProperties(&p, d));
    if (r == 0) first = p;
    // The kernels' choices (tiles, grids) are made once per process from the first GPU's limits.
    DSV4_CHECK(p.major == first.major && p.minor == first.minor && p.multiProcessorCount == first.multiProcessorCount,
               "the tensor-parallel GPUs differ (GPU {}: {}, GPU {}: {}): one kind of GPU per model", backends[0]->device(),
               first.name, d, p.name);
    group->devices.push_back(d);
  }
  group->init();
  log_info("NCCL {}: {} ranks on GPUs {}", nccl_version(), backends.size(), fmt::join(group->devices, ", "));
  CommunicatorGroup out;
  for (int r = 0; r < int(backends.size()); ++r) out.ranks.push_back(std::make_unique<NcclCommunicator>(group, r));
  out.abort = [group] {
    std::lock_guard<std::mutex> lock(group->mu);
    if (group->aborted) return;
    group->aborted = true;
    // Ends the collectives already enqueued that wait for the failed rank (ranks block in a stream
    // synchronisation, not in the enqueue).
    for (ncclComm_t& c : group->comms)
      if (c) nccl().comm_abort(c), c = nullptr;
  };
  out.reset = [group] {
    std::lock_guard<std::mutex> lock(group->mu);
    if (!group->aborted) return;
    for (CudaBackend* b : group->backends) {
      DSV4_CUDA_CHECK(cudaSetDevice(b->device()));
      DSV4_CUDA_CHECK(cudaStreamSynchronize(b->stream()));
    }
    group->init();
    group->aborted = false;
  };
  return out;
}

}  // namespace dsv4::cuda
#endif  // DSV4_HAVE_NCCL_HEADER
