// The CUDA backend: every op of backend.h on the GPU, composed of the kernels in this folder (one
// op per .cu, each tested against its CPU twin). All work goes to one stream in order, except a
// branch (Backend::branch_begin, the shared expert at decode sizes) on a side stream; a step's
// tensors come from a caching pool, so a step after the first of its shape allocates nothing from
// the driver, and no op uploads, reads back or synchronises: host reads (to_host) are the only
// synchronisation, and a step can be recorded as a CUDA graph (begin_capture) and replayed.
// Workspaces an op grows (attention plans, indexer and MoE scratch) grow outside a recording: a
// step of a new shape runs once eagerly before it is recorded.
//
// Where a kernel has a fixed head count (sparse MLA: 16/32/64 heads; indexer: 64 heads) smaller
// models are padded with zero heads: a zero query head's scores are 0 and its output is dropped;
// a zero indexer head weight adds an exact 0 to every score.
#pragma once
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/moe_fp4_reference.h"
#include "backend/cuda/act_quant_fp8.h"
#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/linear_gemm.h"

namespace dsv4::cuda {

class IndexerWorkspace;
class SparseMlaPlan;
class MoeWorkspace;
enum class MoeFp4Path : uint8_t;

// Device memory handed out by size class and kept for reuse (stream-ordered: one stream).
// While a step is recorded, blocks come from the recordings' own free blocks, else from the free
// list — and then belong to recordings for good: work run as called never gets a recording's
// block, so a tensor that lives across a replay (a descriptor, a sampled token) cannot share
// memory with the replayed step's scratch. Recordings share their blocks with each other: they
// replay one at a time on the one stream, and their results are read before the next replay.
class DeviceMemoryPool {
 public:
  ~DeviceMemoryPool();
  void* get(size_t bytes);
  void put(void* p, size_t bytes);
  void set_recording(bool on) { recording_ = on; }
  size_t bytes_held() const { return held_; }

 private:
  static size_t size_class(size_t bytes);
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_, recorded_free_;
  std::set<void*> recorded_;
  bool recording_ = false;
  size_t held_ = 0;
};

class CudaBackend final : public Backend {
 public:
  // On GPU `device` (made the calling thread's current device): every later call into this backend
  // comes from a thread whose current device that is — a tensor-parallel rank's own thread.
  explicit CudaBackend(int device = 0);
  ~CudaBackend() override;
  std::string name() const override;
  // Where ops enqueue: the backend's stream, or inside a branch (SideBranch) the side stream.
  cudaStream_t stream() const { return active_; }
  int device() const { return device_.index; }

  const void* place_weight(const void* host, size_t bytes) override;
  void prepare_experts(MoeWeights& w, float swiglu_limit) override;
  void synchronize() override;
  // On the side stream (fork_side ... join_side below); DSV4_BRANCHES=0 runs them in line.
  void branch_begin() override {
    if (branches_) fork_side();
  }
  void branch_end() override { unfork_side(); }
  void branch_join() override { join_side(); }
  bool can_capture() const override { return true; }
  void begin_capture() override;
  std::unique_ptr<CapturedWork> end_capture() override;
  void replay(const CapturedWork& work) override;
  int64_t recorded_items() const override;
  // Through CUPTI's activity records (replay_trace.cpp).
  std::vector<std::vector<CapturedWork::TracedItem>> trace_replays(const CapturedWork& work, int replays,
                                                                   std::string& why_not) override;
  uint64_t recording_epoch() const override { return epoch_; }
  int mark() override;
  double elapsed_ms(int from, int to) override;
  void clear_marks() override { marks_used_ = 0; }

  Tensor alloc(DType dtype, std::vector<int64_t> shape) override;
  Tensor from_host(DType dtype, std::vector<int64_t> shape, const void* data) override;
  void upload(const Tensor& dst, const void* data) override;
  Tensor generate(const RandomFill& fill, DType dtype, std::vector<int64_t> shape) override;
  void to_host(const Tensor& t, void* dst) override;
  void copy_rows(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row, int64_t rows) override;
  Tensor gather_rows(const Tensor& src, const Tensor& rows) override;

  Tensor embed(const Tensor& ids, const uint16_t* table, int dim) override;
  Tensor rms_norm(const Tensor& x, const uint16_t* weight, float eps) override;
  void head_rms_norm(Tensor& x, int head_dim, float eps) override;
  void rope(Tensor& x, int head_dim, int rope_dim, const Tensor& positions, const RopeTable& table,
            bool inverse) override;
  void norm_rope(Tensor& x, int head_dim, const uint16_t* weight, float eps, int rope_dim, const Tensor& positions,
                 const RopeTable& table, bool fp8_nope) override;
  void head_norm_rope(Tensor& x, int head_dim, float eps, int rope_dim, const Tensor& positions,
                      const RopeTable& table) override;
  void fp8_simulate(Tensor& x, int row_width, int channels) override;
  void hadamard_fp4_simulate(Tensor& x, int width) override;
  Tensor add(const Tensor& a, const Tensor& b) override;
  Tensor scale(const Tensor& x, float s) override;

  Tensor linear(const Tensor& x, const LinearWeight& w) override;
  std::vector<Tensor> linears(const Tensor& x, const std::vector<const LinearWeight*>& ws) override;
  Tensor linear_partial(const Tensor& x, const LinearWeight& w) override;
  Tensor linear_bf16(const Tensor& x, const uint16_t* w, int out, int in) override;
  Tensor linear_f32(const Tensor& x, const uint16_t* w, int out, int in) override;
  std::vector<Tensor> linears_f32(const Tensor& x, const std::vector<std::pair<const uint16_t*, int>>& ws,
                                  int in) override;
  Tensor grouped_out_proj(const Tensor& o, const LinearWeight& wo_a, int groups, int rank) override;

  Tensor hc_pre(const Tensor& X, const HyperConnection& hc, int hc_mult, int iters, float norm_eps, float hc_eps,
                Tensor* post, Tensor* comb, const uint16_t* norm) override;
  Tensor hc_post(const Tensor& y, const Tensor& X, const Tensor& post, const Tensor& comb) override;
  Tensor hc_post_pre(const Tensor& y, const Tensor& X, Tensor* Xa, const HyperConnection& hc, int hc_mult, int iters,
                     float norm_eps, float hc_eps, Tensor* post, Tensor* comb, const uint16_t* norm) override;
  Tensor hc_head(const Tensor& X, const HyperConnection& hc, int hc_mult, float norm_eps, float hc_eps,
                 const uint16_t* norm) override;

  void grow_pool(EntryPool& pool, int64_t pages) override;
  void write_entries(const Tensor& values, const Tensor& entries, EntryPool& pool) override;
  void copy_entries(const Tensor& src, const Tensor& dst, EntryPool& pool) override;
  Tensor step_indices(const StepIndexArgs& args) override;
  std::vector<Tensor> step_index_sets(const std::vector<StepIndexArgs>& sets) override;
  Tensor sparse_attention(const Tensor& q, int n_heads, int head_dim, const EntryPool& kv_pool, const Tensor& entry_lists,
                          const float* sink, float scale) override;
  Tensor indexer_topk(const Tensor& q, const Tensor& head_weights, int n_heads, const EntryPool& key_pool,
                      const KeyTables& keys, int k) override;

  void grow_compressor_states(CompressorStates& states, int64_t slots) override;
  void compressor_state_init(CompressorStates& states, int64_t slot) override;
  Tensor compressor_update(const Tensor& a, const Tensor& g, const StepTables& step, const Tensor& slots,
                           int64_t capacity, int64_t max_span_rows, const float* ape, CompressorStates& states) override;
  Tensor to_bf16(const Tensor& x) override;

  Routing route(const Tensor& x, const MoeWeights& w, const Tensor& token_ids, int k, float route_scale) override;
  void moe_begin(const Tensor& x, const MoeWeights& w, float swiglu_limit) override;
  Tensor moe_experts(const Tensor& x, const Routing& r, const MoeWeights& w, float swiglu_limit) override;
  Tensor moe_expert_partials(const Tensor& x, const Routing& r, const MoeWeights& w, float swiglu_limit) override;
  Tensor moe_combine(const Tensor& partials, const Routing& r) override;

  Tensor logits(const Tensor& h, const uint16_t* head, int vocab) override;
  Tensor sample(const Tensor& logits, const Tensor& params, const Tensor& counters) override;
  void apply_penalties(Tensor& logits, const Tensor& params, const Tensor& rows, const Tensor& ids,
                       const Tensor& counts) override;
  LogprobRows logprobs(const Tensor& logits, const Tensor& chosen, int top_n) override;

 private:
  // Memory that outlives steps (cache pools, compressor state): owned, never from the tensor pool,
  // so no address a recorded step uses as scratch is ever handed to state (DESIGN §3.2).
  Tensor alloc_state(DType dtype, std::vector<int64_t> shape);
  SparseMlaPlan& attention_plan(int queries, int heads, int list_len);
  Tensor linear_out(const Tensor& x, const LinearWeight& w, bool f32);  // linear, or linear_partial with f32
  // FP8_BLOCK linears of one input (same width): x quantised once; each weight on cuBLASLt or the
  // kernel by its rows and shape, the kernel's weights in one launch. bf16 results, or with f32
  // linear_partial's.
  std::vector<Tensor> fp8_linears(const Tensor& x, const std::vector<const LinearWeight*>& ws, bool f32);
  // The same from x quantised already (act_quant_fp8's codes q [rows, K] and scales s): into out, one
  // tensor per weight, allocated by the caller.
  void fp8_linears_quantised(const Tensor& q, const Tensor& s, const std::vector<const LinearWeight*>& ws, bool f32,
                             std::vector<Tensor>& out);
  // The MoE's input x quantised once (act_quant_fp8): codes and scales for the shared expert's FP8
  // linears, and with `values` x on the FP8 grid in bf16 for the routed experts' W4A16 paths.
  struct MoeInput {
    Tensor q, s, values;
  };
  // act_quant_fp8 of an op's bf16 output made by that op (Tensor::companion): rms_norm and the
  // hyper-connections' normed x_in, for up to kQuantCompanionRows rows (a decode step's: there the
  // quantising launch is a dependent round on the chain; a prefill chunk's linears quantise in their
  // own launch). `of` is the output's data, so that a view of other memory never takes it.
  static constexpr int64_t kQuantCompanionRows = 64;
  // Tensor::companion on this backend points to one of these (as a Companion), told apart by type.
  struct Companion {
    virtual ~Companion() = default;
    const void* of = nullptr;  // the data it was made beside
  };
  struct QuantCompanion : Companion, MoeInput {};
  // x's companion of type C, if it was made beside x's data.
  template <typename C>
  static const C* companion_of(const Tensor& x) {
    const auto* typed = dynamic_cast<const C*>(static_cast<const Companion*>(x.companion.get()));
    return typed && typed->of == x.data ? typed : nullptr;
  }
  // Allocates out's companion (values too if asked) and returns the kernels' pointers to it.
  Fp8Rows attach_quant_companion(Tensor& out, bool values);
  // x's companion if it holds x's rows of width K, else null.
  static const QuantCompanion* quant_companion(const Tensor& x, int64_t K);
  Fp8Rows hc_quant_companion(Tensor& out);  // out's companion where the hc kernels can write it, else none
  MoeInput quantise_moe_input(const Tensor& x, bool values);
  // The shared expert (SPEC §3.7): w2(swiglu(w1·x, w3·x)), bf16 or (f32) linear_partial's. FP8 weights
  // take x's codes and scales from `in` and the SwiGLU goes straight to FP8 for w2 (one launch);
  // other formats run the linears.
  // `keep` (if set) takes its scratch tensors, for a caller that runs it on a branch (SideBranch).
  Tensor shared_expert(const Tensor& x, const MoeInput& in, const ExpertWeights& shared, float swiglu_limit, bool f32,
                       std::vector<Tensor>* keep = nullptr);
  // The shared expert on a branch beside the routed experts, for steps of up to shared_branch_rows_
  // rows (DSV4_MOE_SHARED_BRANCH=N; 0: always in line). Up to 8 rows both are latency-bound and read
  // different weights, so HBM serves them together; at 16 and 64 rows in line was faster on the H200
  // (docs/perf/2026-12-03-branches.md).
  Tensor shared_expert_beside(const Tensor& x, const MoeInput& in, const ExpertWeights& shared, float swiglu_limit,
                              bool f32, std::vector<Tensor>& keep);
  // The shared expert moe_begin started on the branch (before the router), for the moe_experts of
  // the same x, weights and limit; its tensors live until the branch is joined. A begun expert
  // nobody takes is joined and dropped by the next moe_begin, moe_expert_partials, synchronize or
  // the start or end of a recording.
  struct SharedAhead {
    const void* x = nullptr;
    const MoeWeights* w = nullptr;
    float swiglu_limit = 0;
    MoeInput in;
    Tensor y;
    std::vector<Tensor> keep;
  };
  std::unique_ptr<SharedAhead> shared_ahead_;
  // shared_ahead_ for this call (null if it was begun for another), the branch joined first otherwise.
  std::unique_ptr<SharedAhead> take_shared_ahead(const Tensor& x, const MoeWeights& w, float swiglu_limit, bool values);
  // A begun shared expert nobody took: the branch joined, then its tensors go.
  void drop_shared_ahead();
  // A branch of work beside the stream: ops called between fork_side and unfork_side enqueue on
  // side_, which first waits for the stream; join_side makes the stream wait for side_. A recording
  // holds the branch as a graph branch. Tensors the branch uses must live until join_side: the pool
  // orders reuse by the host's calls, which a second stream breaks.
  void fork_side();
  void unfork_side() { active_ = stream_.get(); }
  void join_side();
  // The bf16-weight linears (linear_bf16w's arguments): cuBLASLt where the path mode and the rows
  // choose it and it can run the shape with bf16 x, else the CUDA-core kernel.
  void dense_bf16w(const void* x, bool x_f32, int64_t rows, int K, int64_t x_row_stride, int groups, const uint16_t* w,
                   int N, void* y, bool y_f32);
  bool dense_bf16w_on_gemm(const void* x, bool x_f32, int64_t rows, int K, int64_t x_row_stride, int groups,
                           const uint16_t* w, int N, void* y, bool y_f32) const;
  std::string linear_paths() const;  // for the load log
  std::string attention_paths() const;
  IndexerWorkspace& indexer_workspace(int queries, int keys);

  // First member: the device is current before the stream, the pool and the cuBLASLt handle exist.
  struct DeviceSelection {
    explicit DeviceSelection(int device);
    int index;
  } device_;
  // One stream's kernels get the higher launch priority (the block scheduler places their waiting
  // blocks first), in a recording too (node priorities): the main stream's unless
  // DSV4_STREAM_PRIORITY says side or none (cuda_backend.cpp).
  static int stream_priority(bool side);
  static unsigned graph_flags();
  Stream stream_{stream_priority(false)};
  Stream side_{stream_priority(true)};
  cudaStream_t active_ = stream_.get();
  Event fork_event_{false}, join_event_{false};
  bool side_pending_ = false;
  int64_t shared_branch_rows_ = 8;
  bool branches_ = true;  // DSV4_BRANCHES=0: Backend::branch_begin runs the branch in line
  std::shared_ptr<DeviceMemoryPool> memory_;
  // The hyper-connection mixes' ticket (hyper_connection.h): zeroed once, left zeroed by each launch.
  DeviceBuffer<unsigned> hc_ticket_;
  // DSV4_ONE_LAUNCH=0 (A/B runs): a decode step's hc mixes and its routing with the pairs' grouping
  // take two launches each, as for prefill, and its FP8 linears quantise their input in a launch of
  // their own (no QuantCompanion). The one ticket serves the stream's hc ops one after
  // another; on a branch (another stream, which may overlap them) they take the two launches.
  bool one_launch_ = true;
  unsigned* hc_ticket() const { return one_launch_ && active_ == stream_.get() ? hc_ticket_.get() : nullptr; }
  uint64_t epoch_ = 0;  // recording_epoch: bumped where memory a recording may address is replaced
  std::vector<DeviceBuffer<uint8_t>> weights_;  // placed weights, alive as long as the backend
  std::map<std::tuple<int, int, bool>, std::unique_ptr<SparseMlaPlan>> plans_;  // (query bucket, heads, split)
  std::unique_ptr<IndexerWorkspace> indexer_ws_;
  MoeWorkspace& moe_workspace(const MoeFp4Shape& shape, int tokens, int k);
  MoeFp4Path moe_path(const MoeFp4Shape& shape, int tokens, int k) const;  // the dispatcher's, or DSV4_MOE_PATH's
  // Whether route() left r's pairs grouped in ws for `path` (Routing::prepared) and nothing has been
  // grouped into ws since, so the MoE skips its grouping. Every grouping into a workspace takes the
  // next number of groupings_; ws_grouping_ holds each workspace's last.
  bool pairs_grouped(const Routing& r, const MoeWorkspace& ws, MoeFp4Path path) const;
  std::map<const MoeWorkspace*, uint64_t> ws_grouping_;
  uint64_t groupings_ = 0;
  // One scratch per expert shape, shared by the layers (they run one after another on the stream).
  std::map<std::tuple<int, int, int, int, int>, std::unique_ptr<MoeWorkspace>> moe_ws_;
  int moe_path_override_ = -1;  // DSV4_MOE_PATH (tests): a forced MoeFp4Path
  // Dense linears: the decode kernels, cuBLASLt bf16 GEMMs from the rows of linear_gemm.h
  // (kBf16GemmMinRows, kFp8GemmMinRows); DSV4_LINEAR_PATH forces one. gemm_ is null when the
  // kernels are forced.
  LinearPathMode linear_mode_ = LinearPathMode::Auto;
  std::unique_ptr<LinearGemm> gemm_;
  bool logged_paths_ = false;
  std::vector<std::unique_ptr<Event>> marks_;  // profiling marks, reused after clear_marks
  int marks_used_ = 0;
};

}  // namespace dsv4::cuda
