// RAII wrappers and error checks shared by the CUDA backend, its tests and its benchmarks.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "core/error.h"

#define DSV4_CUDA_CHECK(expr)                                                              \
  do {                                                                                     \
    cudaError_t err_ = (expr);                                                             \
    if (err_ != cudaSuccess)                                                               \
      ::dsv4::fail("CUDA error {} at {}:{}: {}", cudaGetErrorName(err_), __FILE__, __LINE__, \
                   cudaGetErrorString(err_));                                              \
  } while (0)

// Checks the launch just made (configuration errors) without synchronising.
#define DSV4_CUDA_CHECK_LAUNCH() DSV4_CUDA_CHECK(cudaGetLastError())

namespace dsv4::cuda {

// Raises `kernel`'s dynamic shared-memory limit to at least `bytes` on the current device (never
// lowers it). The attribute belongs to the kernel's copy in each device's context, so a process
// driving several GPUs (a tensor-parallel rank per GPU) raises it on each.
inline void allow_dynamic_smem(const void* kernel, int bytes) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, int> raised;
  int device = 0;
  DSV4_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  int& limit = raised[{device, kernel}];
  if (bytes <= limit) return;
  DSV4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  limit = bytes;
}
template <typename... Args>
void allow_dynamic_smem(void (*kernel)(Args...), int bytes) {
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}

// An attribute of the current device (SM count, shared memory opt-in, compute capability, …).
inline int device_attribute(cudaDeviceAttr attr) {
  int device = 0, v = 0;
  DSV4_CUDA_CHECK(cudaGetDevice(&device));
  DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, device));
  return v;
}

// Whether the current device is an sm_90 GPU running the sm_90a code of every given kernel (the
// Hopper-only paths: wgmma, setmaxnreg; their bodies are empty in the other architectures' code).
template <typename... Kernels>
bool runs_sm90a_code(Kernels... kernels) {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
    return false;
  auto sm90a = [](auto kernel) {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return attr.binaryVersion == 90;
  };
  return major == 9 && minor == 0 && (sm90a(kernels) && ...);
}

// Owns one device allocation.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count) DSV4_CUDA_CHECK(cudaMalloc(&ptr_, count * sizeof(T)));
  }
  ~DeviceBuffer() { if (ptr_) cudaFree(ptr_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_) cudaFree(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

  void upload(const T* host, size_t count, cudaStream_t s = nullptr) {
    DSV4_CUDA_CHECK(cudaMemcpyAsync(ptr_, host, count * sizeof(T), cudaMemcpyHostToDevice, s));
  }
  void upload(const std::vector<T>& host, cudaStream_t s = nullptr) { upload(host.data(), host.size(), s); }
  std::vector<T> download(cudaStream_t s = nullptr) const {
    std::vector<T> host(count_);
    DSV4_CUDA_CHECK(cudaMemcpyAsync(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost, s));
    DSV4_CUDA_CHECK(cudaStreamSynchronize(s));
    return host;
  }
  // Fills every byte with `byte` (tests poison outputs with 0xff = NaN for bf16/f32).
  void fill_bytes(int byte, cudaStream_t s = nullptr) { DSV4_CUDA_CHECK(cudaMemsetAsync(ptr_, byte, bytes(), s)); }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

class Stream {
 public:
  // priority: as cudaStreamCreateWithPriority (0 the default and lowest, negative higher).
  explicit Stream(int priority = 0) {
    DSV4_CUDA_CHECK(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, priority));
  }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void sync() const { DSV4_CUDA_CHECK(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_{};
};

class Event {
 public:
  // timing false: an ordering point only (cheaper to record and wait on).
  explicit Event(bool timing = true) {
    DSV4_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~Event() { cudaEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t s) { DSV4_CUDA_CHECK(cudaEventRecord(e_, s)); }
  // Milliseconds from `start` to this event (both recorded, this one completed).
  float elapsed_ms_since(const Event& start) const {
    DSV4_CUDA_CHECK(cudaEventSynchronize(e_));
    float ms = 0;
    DSV4_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
    return ms;
  }

 private:
  cudaEvent_t e_{};
};

// Launches `kernel` as a programmatic dependent of the work before it in `stream` (PDL, sm_90+;
// ignored on older GPUs): its CTAs may be scheduled while that work is still running, so its launch
// latency hides behind it. The kernel must execute pdl_wait() (ptx_primitives.cuh) before it touches
// anything the earlier work writes, and may call pdl_launch_dependents() to let the next kernel do
// the same. Captured into CUDA graphs as programmatic edges.
template <typename... KernelArgs, typename... Args>
void launch_programmatic(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                         Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  DSV4_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// Owns a captured CUDA graph and its executable instance.
class Graph {
 public:
  Graph() = default;
  ~Graph() { reset(); }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  // Captures everything `body(stream)` enqueues on `stream`.
  template <typename F>
  void capture(cudaStream_t stream, F&& body) {
    reset();
    DSV4_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    body(stream);
    DSV4_CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
    DSV4_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  void launch(cudaStream_t stream) const { DSV4_CUDA_CHECK(cudaGraphLaunch(exec_, stream)); }
  void reset() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
  }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace dsv4::cuda
