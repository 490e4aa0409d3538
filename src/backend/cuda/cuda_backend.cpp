// CUDA backend: memory, weights, row ops, linears, hyper-connections and the head. Attention,
// caches and the compressor are in cuda_backend_attention.cpp, the MoE in cuda_backend_moe.cpp.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <memory>

#include "backend/cuda/act_quant_fp8.h"
#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/hyper_connection.h"
#include "backend/cuda/indexer_topk.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/logit_processing.h"
#include "backend/cuda/moe_fp4.h"
#include "backend/cuda/random_fill.h"
#include "backend/cuda/row_ops.h"
#include "backend/cuda/sampling.h"
#include "backend/cuda/sparse_mla_decode.h"
#include "core/error.h"
#include "core/log.h"

namespace dsv4::cuda {

// ---- memory ----

DeviceMemoryPool::~DeviceMemoryPool() {
  for (auto* lists : {&free_, &recorded_free_})
    for (auto& [size, list] : *lists)
      for (void* p : list) cudaFree(p);
}

// Four classes per power of two (≤ 25% slack), 256 bytes at least.
size_t DeviceMemoryPool::size_class(size_t bytes) {
  bytes = std::max<size_t>(bytes, 256);
  const size_t top = std::bit_floor(bytes);
  const size_t step = std::max<size_t>(top / 4, 256);
  return (bytes + step - 1) / step * step;
}

void* DeviceMemoryPool::get(size_t bytes) {
  const size_t c = size_class(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto take = [&](std::map<size_t, std::vector<void*>>& lists) -> void* {
      auto it = lists.find(c);
      if (it == lists.end() || it->second.empty()) return nullptr;
      void* p = it->second.back();
      it->second.pop_back();
      return p;
    };
    if (recording_) {
      if (void* p = take(recorded_free_)) return p;
      if (void* p = take(free_)) return recorded_.insert(p), p;
      fail("CUDA backend: the step being recorded needs a new {:.1f} MB block; a step is recorded only after one of its "
           "shape ran as called",
           double(c) / 1e6);
    }
    if (void* p = take(free_)) return p;
  }
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, c);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    fail("CUDA backend: out of device memory allocating {:.1f} MB ({} MB already held by the tensor pool)", double(c) / 1e6,
         held_ / 1000000);
  }
  held_ += c;
  return p;
}

void DeviceMemoryPool::put(void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  (recorded_.count(p) ? recorded_free_ : free_)[size_class(bytes)].push_back(p);
}

CudaBackend::DeviceSelection::DeviceSelection(int device) : index(device) {
  int n = 0;
  DSV4_CUDA_CHECK(cudaGetDeviceCount(&n));
  if (device < 0 || device >= n) fail("CUDA device {} does not exist ({} visible)", device, n);
  DSV4_CUDA_CHECK(cudaSetDevice(device));
}

CudaBackend::CudaBackend(int device) : device_(device), memory_(std::make_shared<DeviceMemoryPool>()) {
  if (const char* p = std::getenv("DSV4_MOE_PATH")) {
    const std::string v = p;
    if (v == "w4a16") moe_path_override_ = int(MoeFp4Path::W4A16Decode);
    else if (v == "w4a16-batched") moe_path_override_ = int(MoeFp4Path::W4A16Batched);
    else if (v == "w4a8") moe_path_override_ = int(MoeFp4Path::W4A8);
    else if (v != "auto") fail("DSV4_MOE_PATH={}: expected auto, w4a16, w4a16-batched or w4a8", v);
  }
  linear_mode_ = linear_path_mode_from_env();
  if (const char* p = std::getenv("DSV4_MOE_SHARED_BRANCH")) {
    char* end = nullptr;
    const long v = std::strtol(p, &end, 10);
    if (!*p || *end || v < 0)
      fail("DSV4_MOE_SHARED_BRANCH={}: expected the rows up to which the shared expert runs beside the routed (0: never)", p);
    shared_branch_rows_ = v;
  }
  if (const char* p = std::getenv("DSV4_BRANCHES")) {
    const std::string v = p;
    if (v != "0" && v != "1") fail("DSV4_BRANCHES={}: expected 1 (branches beside the stream) or 0 (in line)", v);
    branches_ = v == "1";
  }
  if (const char* p = std::getenv("DSV4_ONE_LAUNCH")) {
    const std::string v = p;
    if (v != "0" && v != "1")
      fail("DSV4_ONE_LAUNCH={}: expected 1 (decode rows: hc mixes and routing with grouping in one launch each) or 0 (two)", v);
    one_launch_ = v == "1";
  }
  // Created here, never inside a recording: the handle and its workspace are allocations.
  if (linear_mode_ != LinearPathMode::Kernel) gemm_ = std::make_unique<LinearGemm>();
  hc_ticket_ = DeviceBuffer<unsigned>(1);
  hc_ticket_.fill_bytes(0, stream_.get());
}

CudaBackend::~CudaBackend() {
  // The members go with this device current (the caller may be another rank's thread).
  cudaSetDevice(device_.index);
  cudaStreamSynchronize(side_.get());
  cudaStreamSynchronize(stream_.get());
}

std::string CudaBackend::name() const {
  const int device = device_.index;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "cuda";
  return fmt::format("cuda ({}, sm_{}{}, {} SMs, {:.0f} GB)", prop.name, prop.major, prop.minor, prop.multiProcessorCount,
                     double(prop.totalGlobalMem) / 1e9);
}

void CudaBackend::synchronize() {
  join_side();
  drop_shared_ahead();
  stream_.sync();
}

namespace {
// The stream whose kernels the block scheduler places first: "main" (the default), "side" or ""
// (DSV4_STREAM_PRIORITY=none: both at the default priority). The step's critical path is the main
// stream; a branch (the compressors, the shared expert) has slack until its join, so when blocks of
// both wait for a free SM the main stream's go first: ~1% of a batch-1 step on an H100
// (docs/perf/2026-12-06-stream-priority.md).
std::string priority_stream() {
  static const std::string which = [] {
    const char* p = std::getenv("DSV4_STREAM_PRIORITY");
    const std::string v = p ? p : "main";
    if (v != "main" && v != "side" && v != "none") fail("DSV4_STREAM_PRIORITY={}: expected main, side or none", v);
    return v == "none" ? std::string() : v;
  }();
  return which;
}
}  // namespace

int CudaBackend::stream_priority(bool side) {
  if (priority_stream() != (side ? "side" : "main")) return 0;
  int least = 0, greatest = 0;
  DSV4_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  return greatest;
}

unsigned CudaBackend::graph_flags() {
  return priority_stream().empty() ? 0u : unsigned(cudaGraphInstantiateFlagUseNodePriority);
}

void CudaBackend::fork_side() {
  DSV4_CHECK(active_ == stream_.get(), "fork_side: already on the branch");
  fork_event_.record(stream_.get());
  DSV4_CUDA_CHECK(cudaStreamWaitEvent(side_.get(), fork_event_.get()));
  active_ = side_.get();
  side_pending_ = true;
}

void CudaBackend::join_side() {
  unfork_side();
  if (!side_pending_) return;
  join_event_.record(side_.get());
  DSV4_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), join_event_.get()));
  side_pending_ = false;
}


void CudaBackend::begin_capture() {
  drop_shared_ahead();  // (its branch began outside the recording)
  // Thread-local mode: a driver allocation or a synchronising call from this thread while
  // recording is an error, so a recording that succeeds proves the step does neither.
  DSV4_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
  memory_->set_recording(true);
}

std::unique_ptr<CapturedWork> CudaBackend::end_capture() {
  memory_->set_recording(false);
  join_side();  // a recording ends on the stream it began on, every branch joined
  drop_shared_ahead();
  auto g = std::make_unique<CudaGraph>();
  const cudaError_t err = cudaStreamEndCapture(stream(), &g->graph);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    fail("CUDA backend: recording the step failed ({}): it synchronised, read back or allocated while recording",
         cudaGetErrorString(err));
  }
  DSV4_CUDA_CHECK(cudaGraphInstantiate(&g->exec, g->graph, graph_flags()));
  return g;
}

void CudaBackend::replay(const CapturedWork& work) {
  const auto* g = dynamic_cast<const CudaGraph*>(&work);
  DSV4_CHECK(g && g->exec, "replay: not a recording of this backend");
  DSV4_CUDA_CHECK(cudaGraphLaunch(g->exec, stream()));
}

int CudaBackend::mark() {
  if (size_t(marks_used_) == marks_.size()) marks_.push_back(std::make_unique<Event>());
  marks_[size_t(marks_used_)]->record(stream());
  return marks_used_++;
}

double CudaBackend::elapsed_ms(int from, int to) {
  DSV4_CHECK(from >= 0 && to < marks_used_ && from <= to, "elapsed_ms: marks {}..{} of {}", from, to, marks_used_);
  return marks_[size_t(to)]->elapsed_ms_since(*marks_[size_t(from)]);
}

const void* CudaBackend::place_weight(const void* host, size_t bytes) {
  DeviceBuffer<uint8_t> buf(std::max<size_t>(bytes, 1));
  if (bytes) DSV4_CUDA_CHECK(cudaMemcpy(buf.get(), host, bytes, cudaMemcpyHostToDevice));
  weights_.push_back(std::move(buf));
  return weights_.back().get();
}

Tensor CudaBackend::alloc(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  const size_t bytes = t.nbytes();
  void* p = memory_->get(bytes);
  std::shared_ptr<DeviceMemoryPool> pool = memory_;
  t.storage = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [pool, bytes](uint8_t* q) { pool->put(q, bytes); });
  t.data = p;
  return t;
}

Tensor CudaBackend::alloc_state(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  void* p = nullptr;
  if (cudaMalloc(&p, std::max<size_t>(t.nbytes(), 1)) != cudaSuccess) {
    (void)cudaGetLastError();
    fail("CUDA backend: out of device memory allocating {:.1f} MB of cache state", double(t.nbytes()) / 1e6);
  }
  // cudaFree waits for the device: state is released between steps, never inside one.
  t.storage = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { cudaFree(q); });
  t.data = p;
  return t;
}

Tensor CudaBackend::from_host(DType dtype, std::vector<int64_t> shape, const void* data) {
  Tensor t = alloc(dtype, std::move(shape));
  // Pageable source: the call returns once the bytes are staged, so `data` may die afterwards.
  if (t.nbytes()) DSV4_CUDA_CHECK(cudaMemcpyAsync(t.data, data, t.nbytes(), cudaMemcpyHostToDevice, stream()));
  return t;
}

void CudaBackend::upload(const Tensor& dst, const void* data) {
  if (dst.nbytes()) DSV4_CUDA_CHECK(cudaMemcpyAsync(dst.data, data, dst.nbytes(), cudaMemcpyHostToDevice, stream()));
}

Tensor CudaBackend::generate(const RandomFill& fill, DType dtype, std::vector<int64_t> shape) {
  Tensor t = alloc_state(dtype, std::move(shape));
  DSV4_CHECK(size_t(random_fill_element_bytes(fill.kind)) == dtype_size(dtype), "generate: a {}-byte fill for {}",
             random_fill_element_bytes(fill.kind), dtype_name(dtype));
  random_fill(fill, t.data, t.numel(), stream());
  return t;
}

void CudaBackend::to_host(const Tensor& t, void* dst) {
  if (!t.nbytes()) return;
  const cudaError_t err = cudaMemcpyAsync(dst, t.data, t.nbytes(), cudaMemcpyDeviceToHost, stream());
  if (err != cudaSuccess) {
    cudaPointerAttributes at{};
    const bool known = cudaPointerGetAttributes(&at, t.data) == cudaSuccess;
    (void)cudaGetLastError();
    fail("CUDA backend: reading back a {} tensor of {} rows ({} bytes at {}, {} memory) failed: {}", dtype_name(t.dtype),
         t.shape.size() ? t.shape[0] : 0, t.nbytes(), t.data,
         !known ? "unknown" : at.type == cudaMemoryTypeDevice ? "device" : at.type == cudaMemoryTypeHost ? "pinned host"
                                                                              : "unregistered host",
         cudaGetErrorString(err));
  }
  stream_.sync();
}

void CudaBackend::copy_rows(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row, int64_t rows) {
  dst.companion.reset();
  const size_t row_bytes = src.rows() ? src.nbytes() / size_t(src.rows()) : 0;
  if (!rows || !row_bytes) return;
  DSV4_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(dst.data) + size_t(dst_row) * row_bytes,
                                  static_cast<const uint8_t*>(src.data) + size_t(src_row) * row_bytes,
                                  size_t(rows) * row_bytes, cudaMemcpyDeviceToDevice, stream()));
}

// ---- row ops ----

Tensor CudaBackend::embed(const Tensor& ids, const uint16_t* table, int dim) {
  DSV4_CHECK(ids.dtype == DType::I32, "embed: ids must be I32");
  const int64_t n = ids.data ? ids.numel() : 0;
  Tensor out = alloc(DType::BF16, {n, dim});
  if (n) embed_rows(ids.ptr<int32_t>(), n, table, dim, 1, out.ptr<uint16_t>(), stream());
  return out;
}

Fp8Rows CudaBackend::attach_quant_companion(Tensor& out, bool values) {
  const int64_t rows = out.rows(), K = out.numel() / std::max<int64_t>(rows, 1);
  auto c = std::make_shared<QuantCompanion>();  // (held as a Companion: companion_of casts back to it)
  c->q = alloc(DType::U8, {rows, K});
  c->s = alloc(DType::F32, {rows, K / 128});
  if (values) c->values = alloc(DType::BF16, {rows, K});
  c->of = out.data;
  const Fp8Rows rows_out{c->q.ptr<uint8_t>(), c->s.ptr<float>(), values ? c->values.ptr<uint16_t>() : nullptr};
  out.companion = std::shared_ptr<const Companion>(std::move(c));
  return rows_out;
}

const CudaBackend::QuantCompanion* CudaBackend::quant_companion(const Tensor& x, int64_t K) {
  const QuantCompanion* c = companion_of<QuantCompanion>(x);
  const int64_t rows = x.rows();
  return c && x.dtype == DType::BF16 && x.numel() == rows * K && c->q.numel() == rows * K ? c
                                                                                                            : nullptr;
}

Tensor CudaBackend::rms_norm(const Tensor& x, const uint16_t* weight, float eps) {
  const int64_t rows = x.rows(), n = x.numel() / std::max<int64_t>(rows, 1);
  Tensor out = alloc(DType::BF16, x.shape);
  Fp8Rows quant;
  if (one_launch_ && rows <= kQuantCompanionRows && cuda::rms_norm_quant_fits(int(n), x.ptr<uint16_t>(), weight,
                                                                              out.ptr<uint16_t>(), quant))
    quant = attach_quant_companion(out, false);
  cuda::rms_norm(x.ptr<uint16_t>(), weight, rows, int(n), eps, out.ptr<uint16_t>(), stream(), quant);
  return out;
}

void CudaBackend::head_rms_norm(Tensor& x, int head_dim, float eps) {
  x.companion.reset();
  cuda::head_rms_norm(x.ptr<uint16_t>(), x.numel() / head_dim, head_dim, eps, stream());
}

void CudaBackend::rope(Tensor& x, int head_dim, int rope_dim, const Tensor& positions, const RopeTable& table,
                       bool inverse) {
  x.companion.reset();
  const int64_t rows = x.rows();
  if (!rows) return;
  DSV4_CHECK(positions.numel() == rows && positions.dtype == DType::I32, "rope: {} positions for {} rows",
             positions.numel(), rows);
  DSV4_CHECK(table.device, "rope: the frequency table was not placed on the device");
  cuda::rope(x.ptr<uint16_t>(), rows, int(x.numel() / rows / head_dim), head_dim, rope_dim, positions.ptr<int32_t>(),
             table.device, inverse, stream());
}

void CudaBackend::norm_rope(Tensor& x, int head_dim, const uint16_t* weight, float eps, int rope_dim,
                            const Tensor& positions, const RopeTable& table, bool fp8_nope) {
  x.companion.reset();
  const int64_t rows = x.rows();
  if (!rows) return;
  if (!cuda::norm_rope_fits(head_dim, rope_dim, x.ptr<uint16_t>(), weight, fp8_nope))
    return Backend::norm_rope(x, head_dim, weight, eps, rope_dim, positions, table, fp8_nope);
  DSV4_CHECK(positions.numel() == rows && positions.dtype == DType::I32, "norm_rope: {} positions for {} rows",
             positions.numel(), rows);
  DSV4_CHECK(table.device, "norm_rope: the frequency table was not placed on the device");
  cuda::norm_rope(x.ptr<uint16_t>(), rows, int(x.numel() / rows / head_dim), head_dim, weight, eps, rope_dim,
                  positions.ptr<int32_t>(), table.device, fp8_nope, stream());
}

void CudaBackend::head_norm_rope(Tensor& x, int head_dim, float eps, int rope_dim, const Tensor& positions,
                                 const RopeTable& table) {
  x.companion.reset();
  // One launch for a decode step's rows; a prefill chunk's thousands of rows run the two kernels,
  // which spread its heads better (row_ops.cu).
  constexpr int64_t kFusedRows = 64;
  const int64_t rows = x.rows();
  if (rows > kFusedRows) return Backend::head_norm_rope(x, head_dim, eps, rope_dim, positions, table);
  if (!rows) return;
  DSV4_CHECK(positions.numel() == rows && positions.dtype == DType::I32, "head_norm_rope: {} positions for {} rows",
             positions.numel(), rows);
  DSV4_CHECK(table.device, "head_norm_rope: the frequency table was not placed on the device");
  cuda::head_norm_rope(x.ptr<uint16_t>(), rows, int(x.numel() / rows / head_dim), head_dim, eps, rope_dim,
                       positions.ptr<int32_t>(), table.device, stream());
}

void CudaBackend::fp8_simulate(Tensor& x, int row_width, int channels) {
  x.companion.reset();
  cuda::fp8_simulate(x.ptr<uint16_t>(), x.numel() / row_width, row_width, channels, stream());
}

void CudaBackend::hadamard_fp4_simulate(Tensor& x, int width) {
  x.companion.reset();
  DSV4_CHECK(width == 128, "hadamard: width {} (only 128 is used by the model)", width);
  cuda::hadamard_fp4_simulate(x.ptr<uint16_t>(), x.numel() / width, stream());
}

Tensor CudaBackend::add(const Tensor& a, const Tensor& b) {
  DSV4_CHECK(a.numel() == b.numel(), "add: {} and {} elements", a.numel(), b.numel());
  Tensor out = alloc(DType::BF16, a.shape);
  add_bf16(a.ptr<uint16_t>(), b.ptr<uint16_t>(), a.numel(), out.ptr<uint16_t>(), stream());
  return out;
}

Tensor CudaBackend::scale(const Tensor& x, float s) {
  Tensor out = alloc(DType::BF16, x.shape);
  scale_bf16(x.ptr<uint16_t>(), s, x.numel(), out.ptr<uint16_t>(), stream());
  return out;
}

Tensor CudaBackend::to_bf16(const Tensor& x) {
  Tensor out = alloc(DType::BF16, x.shape);
  f32_to_bf16(x.ptr<float>(), x.numel(), out.ptr<uint16_t>(), stream());
  return out;
}

// ---- linears ----

Tensor CudaBackend::linear(const Tensor& x, const LinearWeight& w) { return linear_out(x, w, false); }

Tensor CudaBackend::linear_partial(const Tensor& x, const LinearWeight& w) { return linear_out(x, w, true); }

Tensor CudaBackend::linear_out(const Tensor& x, const LinearWeight& w, bool f32) {
  if (w.format == WeightFormat::BF16) {
    const int64_t rows = x.rows();
    DSV4_CHECK(x.numel() == rows * w.in, "linear {}: input has {} values per row, weight expects {}", w.name,
               x.numel() / std::max<int64_t>(rows, 1), w.in);
    const auto* wb = reinterpret_cast<const uint16_t*>(w.w);
    return f32 ? linear_f32(x, wb, w.out, w.in) : linear_bf16(x, wb, w.out, w.in);
  }
  return fp8_linears(x, {&w}, f32)[0];
}

std::vector<Tensor> CudaBackend::linears(const Tensor& x, const std::vector<const LinearWeight*>& ws) {
  bool together = !ws.empty() && ws.size() <= size_t(kMaxFp8LinearOuts);
  for (const LinearWeight* w : ws) together = together && w->format == WeightFormat::FP8_BLOCK && w->in == ws[0]->in;
  return together ? fp8_linears(x, ws, false) : Backend::linears(x, ws);
}

std::vector<Tensor> CudaBackend::fp8_linears(const Tensor& x, const std::vector<const LinearWeight*>& ws, bool f32) {
  const int64_t rows = x.rows();
  const int K = ws.at(0)->in;
  std::vector<Tensor> out;
  for (const LinearWeight* w : ws) {
    DSV4_CHECK(x.numel() == rows * w->in, "linear {}: input has {} values per row, weight expects {}", w->name,
               x.numel() / std::max<int64_t>(rows, 1), w->in);
    DSV4_CHECK(w->format == WeightFormat::FP8_BLOCK, "linear {}: {} weights run through moe_experts", w->name,
               weight_format_name(w->format));
    DSV4_CHECK(w->in % 128 == 0, "linear {}: input width {} is not a multiple of 128", w->name, w->in);
    out.push_back(alloc(f32 ? DType::F32 : DType::BF16, {rows, w->out}));
  }
  if (!rows) return out;
  if (const QuantCompanion* c = quant_companion(x, K)) {  // quantised by the op that wrote x
    fp8_linears_quantised(c->q, c->s, ws, f32, out);
    return out;
  }
  Tensor q = alloc(DType::U8, {rows, K});
  Tensor s = alloc(DType::F32, {rows, K / 128});
  act_quant_fp8(x.ptr<uint16_t>(), int(rows), K, q.ptr<uint8_t>(), s.ptr<float>(), stream());
  DSV4_CUDA_CHECK_LAUNCH();
  fp8_linears_quantised(q, s, ws, f32, out);
  return out;
}

void CudaBackend::fp8_linears_quantised(const Tensor& q, const Tensor& s, const std::vector<const LinearWeight*>& ws,
                                        bool f32, std::vector<Tensor>& out) {
  const int64_t rows = q.rows();
  const int K = ws.at(0)->in;
  DSV4_CHECK(q.numel() == rows * K && s.numel() == rows * (K / 128) && out.size() == ws.size(),
             "fp8 linears: {} codes, {} scales for {} rows of {}", q.numel(), s.numel(), rows, K);
  Tensor xb;  // the exact bf16 values of the quantised x, made once for the weights that take them
  const auto x_values = [&] {
    if (!xb.data) {
      xb = alloc(DType::BF16, {rows, K});
      fp8_rows_to_bf16(q.ptr<uint8_t>(), s.ptr<float>(), rows, K, xb.ptr<uint16_t>(), stream());
    }
    return xb.ptr<uint16_t>();
  };
  std::vector<Fp8LinearOut> kernel_outs;
  for (size_t i = 0; i < ws.size(); ++i) {
    const LinearWeight& w = *ws[i];
    const bool tiled = linear_mode_ == LinearPathMode::Auto && rows >= kFp8TiledMinRows && rows < kFp8TiledMaxRows &&
                       int64_t(w.out) * w.in >= kFp8GemmLargeValues && w.out >= kFp8TiledMinCols &&
                       linear_fp8w_mma_available(rows, K, K, 1, w.out, nullptr /* xb: a fresh allocation */, w.w);
    const bool gemm = !tiled && gemm_ && linear_path_uses_gemm(linear_mode_, rows, fp8_gemm_min_rows(w.out, w.in)) &&
                      gemm_->fp8_via_bf16_available(rows, w.in, w.out, f32);
    if (tiled) {
      // The tensor-core kernel on the activations' exact bf16 values (linear.h linear_fp8w_mma).
      const size_t ws_bytes = linear_fp8w_mma_workspace(rows, K, w.out);
      Tensor scratch = ws_bytes ? alloc(DType::F32, {int64_t(ws_bytes / 4)}) : Tensor{};
      linear_fp8w_mma(x_values(), rows, K, K, 1, w.w, w.scale, w.out, out[i].data, ws_bytes ? scratch.ptr<float>() : nullptr,
                      stream(), f32);
    } else if (gemm) {
      // Both operands as their exact bf16 values, one bf16 GEMM (linear_gemm.h).
      x_values();
      Tensor wb = alloc(DType::BF16, {w.out, w.in});
      gemm_->fp8_weight_via_bf16(xb.ptr<uint16_t>(), rows, K, w.w, w.scale, w.out, wb.ptr<uint16_t>(), out[i].data,
                                 stream(), f32);
    } else {
      kernel_outs.push_back({w.w, w.scale, w.out, out[i].data});
    }
  }
  if (!kernel_outs.empty())
    linear_fp8_block_quantised(q.ptr<uint8_t>(), s.ptr<float>(), rows, K, kernel_outs.data(), int(kernel_outs.size()),
                               stream(), f32);
}

bool CudaBackend::dense_bf16w_on_gemm(const void* x, bool x_f32, int64_t rows, int K, int64_t x_row_stride, int groups,
                                      const uint16_t* w, int N, void* y, bool y_f32) const {
  // f32 inputs stay on the kernel (cuBLASLt would round them to bf16 or run a tf32 GEMM).
  const int64_t min_rows = 2.0 * double(N) * K >= kBf16GemmAnyRowsBytes ? 1 : kBf16GemmMinRows;
  return !x_f32 && gemm_ && linear_path_uses_gemm(linear_mode_, rows, min_rows) && LinearGemm::bf16_aligned(x, w, y) &&
         gemm_->bf16_available(rows, K, x_row_stride, groups, N, y_f32);
}

void CudaBackend::dense_bf16w(const void* x, bool x_f32, int64_t rows, int K, int64_t x_row_stride, int groups,
                              const uint16_t* w, int N, void* y, bool y_f32) {
  if (!rows) return;
  if (dense_bf16w_on_gemm(x, x_f32, rows, K, x_row_stride, groups, w, N, y, y_f32))
    gemm_->bf16(static_cast<const uint16_t*>(x), rows, K, x_row_stride, groups, w, N, y, y_f32, stream());
  else
    linear_bf16w(x, x_f32, rows, K, x_row_stride, groups, w, N, y, y_f32, stream());
}

Tensor CudaBackend::linear_bf16(const Tensor& x, const uint16_t* w, int out_dim, int in) {
  const int64_t rows = x.rows();
  Tensor out = alloc(DType::BF16, {rows, out_dim});
  dense_bf16w(x.data, x.dtype == DType::F32, rows, in, in, 1, w, out_dim, out.data, false);
  return out;
}

Tensor CudaBackend::linear_f32(const Tensor& x, const uint16_t* w, int out_dim, int in) {
  const int64_t rows = x.rows();
  Tensor out = alloc(DType::F32, {rows, out_dim});
  dense_bf16w(x.data, x.dtype == DType::F32, rows, in, in, 1, w, out_dim, out.data, true);
  return out;
}

std::vector<Tensor> CudaBackend::linears_f32(const Tensor& x, const std::vector<std::pair<const uint16_t*, int>>& ws,
                                             int in) {
  const int64_t rows = x.rows();
  const bool x_f32 = x.dtype == DType::F32;
  DSV4_CHECK(x.numel() == rows * in, "linears_f32: input has {} values per row, the weights expect {}",
             x.numel() / std::max<int64_t>(rows, 1), in);
  std::vector<Tensor> out;
  for (const auto& [w, n] : ws) out.push_back(alloc(DType::F32, {rows, n}));
  // Together where every weight would take the kernel (decode rows); cuBLASLt's GEMMs one by one.
  bool together = rows && ws.size() >= 2 && ws.size() <= size_t(kMaxBf16wOuts);
  for (size_t i = 0; together && i < ws.size(); ++i)
    together = !dense_bf16w_on_gemm(x.data, x_f32, rows, in, in, 1, ws[i].first, ws[i].second, out[i].data, true);
  if (!together) {
    for (size_t i = 0; i < ws.size(); ++i)
      dense_bf16w(x.data, x_f32, rows, in, in, 1, ws[i].first, ws[i].second, out[i].data, true);
    return out;
  }
  Bf16wOut parts[kMaxBf16wOuts];
  for (size_t i = 0; i < ws.size(); ++i) parts[i] = {ws[i].first, ws[i].second, out[i].data};
  linears_bf16w(x.data, x_f32, rows, in, parts, int(ws.size()), true, stream());
  return out;
}

Tensor CudaBackend::grouped_out_proj(const Tensor& o, const LinearWeight& wo_a, int groups, int rank) {
  const int64_t rows = o.rows();
  const int64_t gd = o.numel() / std::max<int64_t>(rows, 1) / groups;
  const bool fp8 = wo_a.format == WeightFormat::FP8_BLOCK;
  DSV4_CHECK(wo_a.out == groups * rank && (!rows || wo_a.in == gd) && (fp8 || wo_a.format == WeightFormat::BF16),
             "grouped_out_proj: {} weight [{}, {}] for {} groups of {} × {}", weight_format_name(wo_a.format), wo_a.out,
             wo_a.in, groups, rank, gd);
  Tensor out = alloc(DType::BF16, {rows, int64_t(groups) * rank});
  if (!rows) return out;
  const int K = wo_a.in, N = wo_a.out;
  const int64_t stride = int64_t(groups) * K;
  if (!fp8) {
    dense_bf16w(o.data, false, rows, K, stride, groups, reinterpret_cast<const uint16_t*>(wo_a.w), N, out.data, false);
    return out;
  }
  // FP8 (the checkpoint's codes, never a stored bf16 copy): the tensor-core kernel, and from
  // kFp8wGemmMinRows (prefill chunks) the weight's bf16 values made for the call and cuBLASLt.
  const auto* x = o.ptr<uint16_t>();
  uint16_t* y = out.ptr<uint16_t>();
  const bool gemm = gemm_ && linear_path_uses_gemm(linear_mode_, rows, kFp8wGemmMinRows) && K % 128 == 0 &&
                    gemm_->bf16_available(rows, K, stride, groups, N, false) && LinearGemm::bf16_aligned(x, wo_a.w, y);
  if (!gemm && linear_fp8w_mma_available(rows, K, stride, groups, N, x, wo_a.w)) {
    const size_t ws_bytes = linear_fp8w_mma_workspace(rows, K, N);
    Tensor ws = ws_bytes ? alloc(DType::F32, {int64_t(ws_bytes / 4)}) : Tensor{};
    linear_fp8w_mma(x, rows, K, stride, groups, wo_a.w, wo_a.scale, N, y, ws_bytes ? ws.ptr<float>() : nullptr, stream());
    return out;
  }
  DSV4_CHECK(K % 128 == 0, "grouped_out_proj: an FP8 wo_a [{}, {}] at {} rows has no path here (the bf16 conversion "
             "takes widths that are multiples of 128)", N, K, rows);
  Tensor w = alloc(DType::BF16, {N, K});
  fp8_weight_to_bf16(wo_a.w, wo_a.scale, N, K, w.ptr<uint16_t>(), stream());
  dense_bf16w(o.data, false, rows, K, stride, groups, w.ptr<uint16_t>(), N, out.data, false);
  return out;
}

std::string CudaBackend::linear_paths() const {
  switch (linear_mode_) {
    case LinearPathMode::Kernel: return "CUDA-core kernels (forced by DSV4_LINEAR_PATH)";
    case LinearPathMode::CublasLt: return "cuBLASLt bf16 GEMMs where they run the shape (forced by DSV4_LINEAR_PATH)";
    case LinearPathMode::Auto: break;
  }
  return fmt::format("FP8: tensor-core kernel, from {} rows (or {} by size) a cuBLASLt bf16 GEMM of the dequantised "
                     "operands; bf16: CUDA-core kernels, cuBLASLt from {} rows (the head: always)",
                     kFp8GemmMinRowsLarge, kFp8GemmMinRows, kBf16GemmMinRows);
}

Tensor CudaBackend::logits(const Tensor& h, const uint16_t* head, int vocab) {
  return linear_f32(h, head, vocab, int(h.numel() / std::max<int64_t>(h.rows(), 1)));
}

Tensor CudaBackend::sample(const Tensor& logits, const Tensor& params, const Tensor& counters) {
  const int64_t rows = logits.rows();
  DSV4_CHECK(int64_t(params.nbytes()) == rows * int64_t(sizeof(SamplingParams)) && int64_t(counters.nbytes()) == rows * 8,
             "sample: {} rows, {} parameter bytes, {} counter bytes", rows, params.nbytes(), counters.nbytes());
  Tensor ids = alloc(DType::I32, {rows});
  if (!rows) return ids;
  const int vocab = int(logits.numel() / rows);
  Tensor ws = alloc(DType::U8, {int64_t(sampling_workspace_bytes(rows, vocab))});
  sample_tokens(logits.ptr<float>(), rows, vocab, static_cast<const SamplingParams*>(params.data),
                static_cast<const uint64_t*>(counters.data), ids.ptr<int32_t>(), ws.data, stream());
  return ids;
}

void CudaBackend::apply_penalties(Tensor& logits, const Tensor& params, const Tensor& rows, const Tensor& ids,
                                  const Tensor& counts) {
  const int64_t R = logits.rows(), n = ids.data ? ids.numel() : 0;
  if (!n) return;
  DSV4_CHECK(rows.numel() == n && counts.numel() == n && int64_t(params.nbytes()) == R * int64_t(sizeof(PenaltyParams)),
             "apply_penalties: {} rows of logits, {} entries", R, n);
  cuda::apply_penalties(logits.ptr<float>(), int(logits.numel() / R), static_cast<const PenaltyParams*>(params.data),
                        rows.ptr<int32_t>(), ids.ptr<int32_t>(), counts.ptr<int32_t>(), n, stream());
}

LogprobRows CudaBackend::logprobs(const Tensor& logits, const Tensor& chosen, int top_n) {
  const int64_t rows = logits.rows();
  DSV4_CHECK(chosen.numel() == rows && top_n >= 0 && top_n <= cuda::kMaxTopLogprobs, "logprobs: {} rows, {} chosen, top {}",
             rows, chosen.numel(), top_n);
  LogprobRows out{alloc(DType::F32, {rows}), alloc(DType::I32, {rows, top_n}), alloc(DType::F32, {rows, top_n})};
  if (!rows) return out;
  const int vocab = int(logits.numel() / rows);
  DSV4_CHECK(top_n <= vocab, "logprobs: top {} of a vocabulary of {}", top_n, vocab);
  cuda::token_logprobs(logits.ptr<float>(), rows, vocab, chosen.ptr<int32_t>(), top_n, out.chosen.ptr<float>(),
                       out.top_ids.ptr<int32_t>(), out.top.ptr<float>(), stream());
  return out;
}

Tensor CudaBackend::gather_rows(const Tensor& src, const Tensor& rows) {
  const int64_t n = rows.data ? rows.numel() : 0, src_rows = src.rows();
  std::vector<int64_t> shape = src.shape;
  shape[0] = n;
  Tensor out = alloc(src.dtype, shape);
  const size_t row_bytes = src_rows ? src.nbytes() / size_t(src_rows) : 0;
  DSV4_CHECK(row_bytes % 2 == 0, "gather_rows: rows of {} bytes", row_bytes);
  // A row gather is an embedding lookup over rows of 16-bit words.
  if (n && row_bytes) embed_rows(rows.ptr<int32_t>(), n, src.ptr<uint16_t>(), int(row_bytes / 2), 1, out.ptr<uint16_t>(), stream());
  return out;
}

// ---- hyper-connections ----

// The normed x_in's codes for the FP8 linears after it (attention's wq_a and wkv) or the MoE (with
// the values: the routed experts' FP8-grid input): one kernel makes both forms, so values always.
Fp8Rows CudaBackend::hc_quant_companion(Tensor& out) {
  const int64_t T = out.rows(), D = out.numel() / std::max<int64_t>(T, 1);
  if (!one_launch_ || T > kQuantCompanionRows || !cuda::act_quant_rows_fit(D)) return {};
  return attach_quant_companion(out, true);  // (pool blocks: aligned as the kernels need, hc_norm_quant_fits)
}

// The norm after the mixes runs inside the finishing kernel where its shape allows (always for DeepSeek-V4),
// else as the rms_norm op on the mixes' output.
Tensor CudaBackend::hc_pre(const Tensor& X, const HyperConnection& hc, int hc_mult, int iters, float norm_eps,
                           float hc_eps, Tensor* post, Tensor* comb, const uint16_t* norm) {
  const int64_t T = X.rows();
  const int64_t D = X.numel() / std::max<int64_t>(T, 1) / hc_mult;
  Tensor out = alloc(DType::BF16, {T, D});
  *post = alloc(DType::F32, {T, hc_mult});
  *comb = alloc(DType::F32, {T, hc_mult, hc_mult});
  if (!T) return out;
  const bool fused = norm && cuda::hc_norm_fits(int(D), X.ptr<uint16_t>(), out.ptr<uint16_t>(), norm);
  Tensor partials = alloc(DType::F32, {cuda::hc_mix_scratch_floats(T, hc_mult, int(D), false)});
  const Fp8Rows quant = fused ? hc_quant_companion(out) : Fp8Rows{};
  cuda::hc_pre(X.ptr<uint16_t>(), T, hc_mult, int(D), hc.fn, hc.base, hc.scale, iters, norm_eps, hc_eps,
               partials.ptr<float>(), fused ? norm : nullptr, out.ptr<uint16_t>(), post->ptr<float>(),
               comb->ptr<float>(), stream(), hc_ticket(), quant);
  return norm && !fused ? rms_norm(out, norm, norm_eps) : out;
}

Tensor CudaBackend::hc_post(const Tensor& y, const Tensor& X, const Tensor& post, const Tensor& comb) {
  const int64_t T = y.rows(), D = y.numel() / std::max<int64_t>(T, 1);
  const int n = int(post.numel() / std::max<int64_t>(T, 1));
  Tensor out = alloc(DType::BF16, X.shape);
  if (T)
    cuda::hc_post(y.ptr<uint16_t>(), X.ptr<uint16_t>(), post.ptr<float>(), comb.ptr<float>(), T, n, int(D),
                  out.ptr<uint16_t>(), stream());
  return out;
}

Tensor CudaBackend::hc_post_pre(const Tensor& y, const Tensor& X, Tensor* Xa, const HyperConnection& hc, int hc_mult,
                                int iters, float norm_eps, float hc_eps, Tensor* post, Tensor* comb,
                                const uint16_t* norm) {
  const int64_t T = X.rows();
  const int64_t D = X.numel() / std::max<int64_t>(T, 1) / hc_mult;
  // One launch fewer for a decode step's rows; a prefill chunk runs hc_post, then hc_pre.
  if (!T || T > cuda::kHcPostPreMaxRows || hc_mult != 4 || D % 4 || y.numel() != T * D)
    return Backend::hc_post_pre(y, X, Xa, hc, hc_mult, iters, norm_eps, hc_eps, post, comb, norm);
  *Xa = alloc(DType::BF16, X.shape);
  Tensor out = alloc(DType::BF16, {T, D});
  Tensor new_post = alloc(DType::F32, {T, hc_mult}), new_comb = alloc(DType::F32, {T, hc_mult, hc_mult});
  const bool fused = norm && cuda::hc_norm_fits(int(D), Xa->ptr<uint16_t>(), out.ptr<uint16_t>(), norm);
  Tensor partials = alloc(DType::F32, {cuda::hc_mix_scratch_floats(T, hc_mult, int(D), false)});
  const Fp8Rows quant = fused ? hc_quant_companion(out) : Fp8Rows{};
  cuda::hc_post_pre(y.ptr<uint16_t>(), X.ptr<uint16_t>(), post->ptr<float>(), comb->ptr<float>(), T, hc_mult, int(D),
                    Xa->ptr<uint16_t>(), hc.fn, hc.base, hc.scale, iters, norm_eps, hc_eps, partials.ptr<float>(),
                    fused ? norm : nullptr, out.ptr<uint16_t>(), new_post.ptr<float>(), new_comb.ptr<float>(), stream(),
                    hc_ticket(), quant);
  *post = std::move(new_post);
  *comb = std::move(new_comb);
  return norm && !fused ? rms_norm(out, norm, norm_eps) : out;
}

Tensor CudaBackend::hc_head(const Tensor& X, const HyperConnection& hc, int hc_mult, float norm_eps, float hc_eps,
                            const uint16_t* norm) {
  const int64_t T = X.rows();
  const int64_t D = X.numel() / std::max<int64_t>(T, 1) / hc_mult;
  Tensor out = alloc(DType::BF16, {T, D});
  if (!T) return out;
  const bool fused = norm && cuda::hc_norm_fits(int(D), X.ptr<uint16_t>(), out.ptr<uint16_t>(), norm);
  Tensor partials = alloc(DType::F32, {cuda::hc_mix_scratch_floats(T, hc_mult, int(D), true)});
  cuda::hc_head(X.ptr<uint16_t>(), T, hc_mult, int(D), hc.fn, hc.base, hc.scale, norm_eps, hc_eps,
                partials.ptr<float>(), fused ? norm : nullptr, out.ptr<uint16_t>(), stream(), hc_ticket());
  return norm && !fused ? rms_norm(out, norm, norm_eps) : out;
}

}  // namespace dsv4::cuda
