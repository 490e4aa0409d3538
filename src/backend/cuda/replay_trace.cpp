// CudaBackend::trace_replays: a recorded step's replays traced on the device through CUPTI's
// activity records (each kernel's, copy's and set's start and end on the GPU's clock), for the
// profile's view of where a replayed step's time goes. CUPTI is opened at run time (dlopen of
// libcupti), as NCCL is: the build needs only the toolkit's headers, and a machine without the
// library still profiles, without the trace.
#include <cupti.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_graph.h"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

struct CuptiLibrary {
  void* handle = nullptr;
  std::string why_not;  // "" when loaded
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;

  static CuptiLibrary& get() {
    static CuptiLibrary lib = load();
    return lib;
  }

 private:
  template <typename F>
  bool resolve(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(handle, name));
    if (!f) why_not = fmt::format("the CUPTI library has no {}", name);
    return f != nullptr;
  }

  static CuptiLibrary load() {
    CuptiLibrary lib;
    std::vector<std::string> tried;
    auto open = [&](const std::string& path) {
      if (lib.handle) return;
      tried.push_back(path);
      lib.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    };
    if (const char* p = std::getenv("DSV4_CUPTI_LIBRARY"); p && *p) {
      open(p);
    } else {
      open("libcupti.so.13");
      open("libcupti.so");
#ifdef DSV4_CUDA_LIBRARY_DIR
      open(std::string(DSV4_CUDA_LIBRARY_DIR) + "/libcupti.so");
#endif
      open("/usr/local/cuda/extras/CUPTI/lib64/libcupti.so");
    }
    if (!lib.handle) {
      lib.why_not = fmt::format("libcupti could not be opened (tried {}): set DSV4_CUPTI_LIBRARY to its path",
                                fmt::join(tried, ", "));
      return lib;
    }
    (void)(lib.resolve(lib.register_callbacks, "cuptiActivityRegisterCallbacks") &&
           lib.resolve(lib.enable, "cuptiActivityEnable") && lib.resolve(lib.disable, "cuptiActivityDisable") &&
           lib.resolve(lib.flush_all, "cuptiActivityFlushAll") && lib.resolve(lib.next_record, "cuptiActivityGetNextRecord") &&
           lib.resolve(lib.result_string, "cuptiGetResultString"));
    return lib;
  }
};

struct Record {
  uint64_t start = 0, end = 0;
  std::string name;
};

// What the activity buffers delivered (CUPTI calls back from its own thread).
std::mutex records_mu;
std::vector<Record> records;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = size_t(8) << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  const CuptiLibrary& lib = CuptiLibrary::get();
  CUpti_Activity* r = nullptr;
  std::lock_guard<std::mutex> lock(records_mu);
  while (lib.next_record(buffer, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
      records.push_back({k->start, k->end, kernel_display_name(k->name)});
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
      records.push_back({c->start, c->end, "copy"});
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* s = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
      records.push_back({s->start, s->end, "set"});
    }
  }
  std::free(buffer);
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};

bool traced_kind(const std::string& name) {
  return name != "host function" && name != "event record" && name != "event wait" && name != "empty" && name != "other";
}

// Each record of one replay (sorted by start) paired with the recording's item it ran: items in
// the order made, each matched to the earliest unmatched record of its name among the next few
// (branches reorder starts only locally), else to the earliest unmatched one ("kernel": a node whose
// function the runtime could not name).
std::vector<CapturedWork::TracedItem> align(const std::vector<Record>& run, const std::vector<std::pair<int64_t, std::string>>& items,
                                            uint64_t origin) {
  constexpr size_t kWindow = 16;
  std::vector<bool> used(run.size(), false);
  std::vector<CapturedWork::TracedItem> out;
  size_t first = 0;  // the first unmatched record
  for (const auto& [item, name] : items) {
    while (first < run.size() && used[first]) ++first;
    size_t pick = first;
    for (size_t i = first, seen = 0; i < run.size() && seen < kWindow; ++i) {
      if (used[i]) continue;
      ++seen;
      if (run[i].name == name) {
        pick = i;
        break;
      }
    }
    if (pick >= run.size()) break;
    used[pick] = true;
    out.push_back({item, run[pick].name, double(run[pick].start - origin) / 1e3, double(run[pick].end - origin) / 1e3});
  }
  return out;
}

}  // namespace

int64_t CudaBackend::recorded_items() const { return captured_items(stream_.get()); }

std::vector<std::vector<CapturedWork::TracedItem>> CudaBackend::trace_replays(const CapturedWork& work, int replays,
                                                                              std::string& why_not) {
  const auto* g = dynamic_cast<const CudaGraph*>(&work);
  DSV4_CHECK(g && g->graph, "trace_replays: not a recording of this backend");
  CuptiLibrary& lib = CuptiLibrary::get();
  if (!lib.why_not.empty()) {
    why_not = lib.why_not;
    return {};
  }
  const auto error = [&](CUptiResult r, const char* what) {
    if (r == CUPTI_SUCCESS) return std::string();
    const char* s = nullptr;
    lib.result_string(r, &s);
    return fmt::format("CUPTI {}: {}", what, s ? s : "error");
  };
  const auto check = [&](CUptiResult r, const char* what) {
    why_not = error(r, what);
    return why_not.empty();
  };
  // Registered once; a failure is reported to every caller, not only the first.
  static const std::string registration_error =
      error(lib.register_callbacks(buffer_requested, buffer_completed), "callbacks");
  if (!registration_error.empty()) {
    why_not = registration_error;
    return {};
  }
  synchronize();
  for (CUpti_ActivityKind k : kKinds)
    if (!check(lib.enable(k), "enable")) return {};
  // A fresh executable graph, made while tracing is on, so that its launches are traced node by node.
  cudaGraphExec_t exec = nullptr;
  DSV4_CUDA_CHECK(cudaGraphInstantiate(&exec, g->graph, graph_flags()));
  DSV4_CUDA_CHECK(cudaGraphLaunch(exec, stream_.get()));  // uploads the graph: not one of the traced runs
  DSV4_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  lib.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  {
    std::lock_guard<std::mutex> lock(records_mu);
    records.clear();
  }
  for (int i = 0; i < replays; ++i) DSV4_CUDA_CHECK(cudaGraphLaunch(exec, stream_.get()));
  DSV4_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  lib.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  for (CUpti_ActivityKind k : kKinds) lib.disable(k);
  cudaGraphExecDestroy(exec);
  std::vector<Record> got;
  {
    std::lock_guard<std::mutex> lock(records_mu);
    got.swap(records);
  }
  std::vector<std::pair<int64_t, std::string>> items;
  const std::vector<std::string> names = g->item_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (traced_kind(names[i])) items.emplace_back(int64_t(i), names[i]);
  if (items.empty() || got.size() != items.size() * size_t(replays)) {
    why_not = fmt::format("the trace held {} records for {} replays of {} items", got.size(), replays, items.size());
    return {};
  }
  // Replays on one stream do not overlap: the records sorted by start fall into runs, one a replay.
  std::sort(got.begin(), got.end(), [](const Record& a, const Record& b) { return a.start < b.start; });
  std::vector<std::vector<CapturedWork::TracedItem>> out;
  for (int r = 0; r < replays; ++r) {
    const std::vector<Record> run(got.begin() + ptrdiff_t(size_t(r) * items.size()),
                                  got.begin() + ptrdiff_t(size_t(r + 1) * items.size()));
    out.push_back(align(run, items, run.front().start));
  }
  return out;
}

}  // namespace dsv4::cuda
