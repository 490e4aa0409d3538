// The backend contract: the small set of ops the DeepSeek-V4 forward (model/dsv4.cpp) is composed
// of. Tensors live in backend memory; the model never reads their data except through to_host().
// Index metadata (token ids, positions, entry ids, lists) is passed as I32 tensors too: the host
// uploads one step descriptor before a step (model/step_plan.h) and every index the ops take is a
// view of it or derived from it on the backend (step_indices), so a step enqueues work without
// reading anything back — the property CUDA graphs need. Each op's numerics are the reference's
// (SPEC §2–§3); a backend that deviates names the deviation where it happens.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtypes.h"
#include "backend/random_fill.h"
#include "backend/sampling_params.h"
#include "backend/weight_types.h"

namespace dsv4 {

struct Tensor {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::shared_ptr<uint8_t> storage;  // backend memory
  void* data = nullptr;
  // The backend's own form of these values, made beside them by the op that wrote them (CUDA: the
  // FP8 codes the next FP8 linear would quantise them into), or null. Only the backend that made it
  // reads it; an op that writes a tensor in place drops it.
  std::shared_ptr<const void> companion;

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  int64_t rows() const { return shape.empty() ? 0 : shape[0]; }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  template <typename T> T* ptr() const { return static_cast<T*>(data); }
  explicit operator bool() const { return data != nullptr || numel() == 0; }
};

// RoPE frequency table for one layer kind (SPEC §2.8): per rope pair i, f_i (YaRN-corrected or not).
// `device` is the backend's copy (Backend::place_weight), set by the model.
struct RopeTable {
  std::vector<float> inv_freq;  // rope_dim / 2
  const float* device = nullptr;
};

// Per-token routing decision.
struct Routing {
  Tensor ids;      // I32 [T, k]
  Tensor weights;  // F32 [T, k]
  // The backend's own form of this routing, made beside it (CUDA: the pairs grouped by expert for the
  // MoE kernels), or null. Only the backend that routed reads it.
  std::shared_ptr<const void> prepared = nullptr;
};

// One compressor's running state (SPEC §3.4) for every sequence of one layer: slot s is one
// sequence's coff·ratio rows × coff·d columns of (kv, score), f32 (coff = 2 when ratio == 4, else 1).
// Owned by the backend (it outlives steps); a step names each span's slot in its descriptor, so
// one op updates every sequence of a step and a recorded step is valid for any sequences.
struct CompressorStates {
  int ratio = 0, d = 0;
  int64_t slots = 0;  // capacity
  Tensor kv, score;   // F32 [slots, coff·ratio, coff·d]
  int64_t slot_floats() const { return int64_t(ratio == 4 ? 2 : 1) * ratio * (ratio == 4 ? 2 : 1) * d; }
};

// Fixed-size cache entries (FP8 KV entries of SPEC §4.2, or FP4 indexer keys) in pages of
// kv_cache_layout.h; a global entry id is page · entries_per_page + slot. Pages are handed out
// by the runtime (block tables); the memory belongs to the backend.
enum class EntryKind { KV, INDEX_KEY };
struct EntryPool {
  EntryKind kind = EntryKind::KV;
  int64_t pages = 0;  // capacity
  Tensor storage;     // U8 [pages · page_bytes]
};

// One step's rows and spans as the backend reads them (views of the step descriptor, I32).
struct StepTables {
  Tensor spans;      // [S, 3]: row0, n, pos0 of each sequence's rows
  Tensor row_span;   // [T]: the span of each row
  Tensor positions;  // [T]
};

// What step_indices derives (SPEC §3.4–§3.6, §4.1) from the step's spans and one layer's block
// tables (page ids; entry j of a table is page[j / 64] · 64 + j % 64).
enum class StepIndexKind {
  NewEntries,           // [T]: row r's entry in the step's scratch pages (`scratch`, entry r)
  RingSlots,            // [T]: row r's window-ring entry (`window`, slot pos mod W) if it is among its
                        //      sequence's last W rows of the step, else −1
  AttentionLists,       // [T, W + C]: the window (oldest first, −1 padded to W; this step's rows from
                        //      scratch), then the compressed part: ratio 4 the indexer's choices
                        //      (`topk` positions → `compressed`), ratio 128 every entry j < (pos+1)/128
  CompressedEntries,    // [E]: the entries this step completes, span by span (`compressed` entry j),
                        //      then −1 up to `count` (a fixed-shape step's capacity)
  CompressedPositions,  // [E]: their first positions, ratio · j (padding: 0)
  KeyCounts,            // [T]: the indexer keys row r sees, (pos + 1) / ratio
};
struct StepIndexArgs {
  StepIndexKind kind = StepIndexKind::NewEntries;
  const StepTables* step = nullptr;
  Tensor window, compressed;  // I32 [S, width] block tables
  Tensor scratch;             // I32 [pages]
  const Tensor* topk = nullptr;  // I32 [T, C] (AttentionLists, ratio 4)
  int ratio = 0, window_size = 0;
  int64_t count = 0;  // CompressedEntries / CompressedPositions: E; AttentionLists: C
};

// The indexer's keys per query: block tables by span (I32 [S, width]), the query's span and key count.
struct KeyTables {
  Tensor pages, query_span, counts;
  int max_keys = 0;
};

// Logprobs of sampled rows (Backend::logprobs): F32 [rows], I32 [rows, top_n], F32 [rows, top_n].
struct LogprobRows {
  Tensor chosen, top_ids, top;
};

// Work recorded once and replayed (CUDA graphs); opaque to the model.
struct CapturedWork {
  virtual ~CapturedWork() = default;
  // Work items the recording holds (kernels, copies), for the profile: a replay costs at least a
  // dependent launch per item. 0 where the backend does not count them.
  virtual int64_t items() const { return 0; }
  // The items by kind (a kernel by name; "copy", "set", ... for the others), most frequent first.
  // `early`: how many of them a programmatic edge enters, i.e. are scheduled before the item
  // ahead completes; every other item waits for a completion and a launch.
  struct ItemKind {
    std::string name;
    int64_t count = 0, early = 0;
  };
  virtual std::vector<ItemKind> item_kinds() const { return {}; }
  // One item of a traced replay (Backend::trace_replays): `item` is its place in the order the
  // recording made the items (what Backend::recorded_items() counted while recording), the times
  // are the device's, in µs from an arbitrary origin.
  struct TracedItem {
    int64_t item = -1;
    std::string name;
    double start_us = 0, end_us = 0;
  };
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Weights (DESIGN §3.3). Where this backend keeps a weight its ops read: the CPU backend reads
  // the host copy (the checkpoint mapping) itself, the CUDA backend copies it to the device once.
  virtual const void* place_weight(const void* host, size_t bytes) { return host; }
  // The backend's form of a layer's routed experts, built from their host views at load (the
  // CUDA backend repacks FP4 experts into its kernel layout); kept in w.prepared.
  virtual void prepare_experts(MoeWeights& w, float swiglu_limit) {}
  // Waits for the work enqueued so far (a no-op on the CPU); timing and tests use it.
  virtual void synchronize() {}
  // A collective of a split model (`run` enqueues it on this backend's queue: a Communicator call)
  // on tensor x, named `op` ("all_reduce"): run as an op of this backend, so a profiling backend
  // times it like the others.
  virtual void collective(const std::string& op, const Tensor& x, const std::function<void()>& run) { run(); }
  // A branch of independent work: the ops called between branch_begin() and branch_end() may run
  // beside the ops called after branch_end(), until branch_join(); after it, every op runs after
  // both. The branch's ops read only what was enqueued before branch_begin() and write nothing the
  // others read or write before the join; the caller keeps every tensor the branch uses alive until
  // branch_join() (a backend's memory reuse follows the order of calls, which a branch breaks). The
  // default runs all in the order called. A recording holds the branch as a branch of its graph.
  virtual void branch_begin() {}
  virtual void branch_end() {}
  virtual void branch_join() {}
  // Records the ops called between begin_capture and end_capture instead of running them; replay
  // runs the recording. Only a backend that can_capture() implements these; a host read or a
  // synchronisation while capturing is an error.
  virtual bool can_capture() const { return false; }
  virtual void begin_capture();
  virtual std::unique_ptr<CapturedWork> end_capture();
  virtual void replay(const CapturedWork& work);
  // The profile's view of a replay. recorded_items(): how many items the recording being made holds
  // so far (so the ops called between two reads made the items between them; 0 where not counted).
  // trace_replays(): replays `work` `replays` times and returns each replay's items as they ran on
  // the device, or nothing with `why_not` set where this backend or machine cannot trace.
  virtual int64_t recorded_items() const { return 0; }
  virtual std::vector<std::vector<CapturedWork::TracedItem>> trace_replays(const CapturedWork& work, int replays,
                                                                           std::string& why_not);
  // Changes whenever memory a recording may address is replaced (a workspace, cache pool or state
  // grown by moving it): recordings made under another value must not be replayed.
  virtual uint64_t recording_epoch() const { return 0; }
  // Profiling (backend/profiling_backend.h): mark() records a point in the backend's queue of work
  // and returns its index; once the work ran (synchronize), elapsed_ms(a, b) is the time between
  // two marks. The default is the host's clock, right for a backend whose ops run as they are
  // called. clear_marks() forgets them. Not while capturing.
  virtual int mark();
  virtual double elapsed_ms(int from, int to);
  virtual void clear_marks();

  // Memory.
  virtual Tensor alloc(DType dtype, std::vector<int64_t> shape) = 0;
  virtual Tensor from_host(DType dtype, std::vector<int64_t> shape, const void* data) = 0;
  // dst.nbytes() bytes from the host into existing memory, in queue order (how a recorded step's
  // descriptor is refilled); `data` may be reused once the call returns.
  virtual void upload(const Tensor& dst, const void* data) = 0;
  // A tensor of random values made in backend memory (backend/random_fill.h: the bytes
  // random_fill_reference makes on the host), owned by the returned tensor (not the step pool).
  virtual Tensor generate(const RandomFill& fill, DType dtype, std::vector<int64_t> shape) = 0;
  virtual void to_host(const Tensor& t, void* dst) = 0;
  virtual void copy_rows(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row, int64_t rows) = 0;
  // Rows rows[i] (I32 [n]) of src, as bytes, into a new [n, ...] tensor of src's dtype.
  virtual Tensor gather_rows(const Tensor& src, const Tensor& rows) = 0;

  // Elementwise / row ops (bf16 unless stated).
  virtual Tensor embed(const Tensor& ids, const uint16_t* table, int dim) = 0;  // rows ids[i] (I32 [n]) of table
  virtual Tensor rms_norm(const Tensor& x, const uint16_t* weight, float eps) = 0;           // x [T, N]
  virtual void head_rms_norm(Tensor& x, int head_dim, float eps) = 0;                         // unweighted, bf16 math (SPEC §3.11.3)
  virtual void rope(Tensor& x, int head_dim, int rope_dim, const Tensor& positions, const RopeTable& table,
                    bool inverse) = 0;  // last rope_dim of every head; positions I32 [rows]
  // (rope, head_norm_rope and norm_rope may read positions while the op before them still runs: they
  // must not be that op's output. The step descriptor's positions are uploaded before the step.)
  virtual void fp8_simulate(Tensor& x, int row_width, int channels) = 0;                      // SPEC §2.5 on [0, channels)
  // x [rows, heads, head_dim] in place, per head: rms_norm with `weight`, rope by positions[row], then
  // with fp8_nope fp8_simulate of the first head_dim − rope_dim channels — the values of those ops run
  // in that order (the default runs them so; a backend may fuse them). KV rows and compressed entries.
  virtual void norm_rope(Tensor& x, int head_dim, const uint16_t* weight, float eps, int rope_dim,
                         const Tensor& positions, const RopeTable& table, bool fp8_nope);
  // head_rms_norm then rope (not inverse): the values of those two (the default runs them; a backend
  // may fuse them). The queries.
  virtual void head_norm_rope(Tensor& x, int head_dim, float eps, int rope_dim, const Tensor& positions,
                              const RopeTable& table);
  virtual void hadamard_fp4_simulate(Tensor& x, int width) = 0;                                // SPEC §2.6–2.7 per `width` chunk
  virtual Tensor add(const Tensor& a, const Tensor& b) = 0;                                    // bf16(a + b)
  virtual Tensor scale(const Tensor& x, float s) = 0;                                          // bf16(x · s)

  // Linears.
  virtual Tensor linear(const Tensor& x, const LinearWeight& w) = 0;                    // bf16 out, reference numerics per format
  // linear(x, *w) for each weight, in order: the values of those calls (the default makes them; a
  // backend may quantise x once and run the weights together). Attention's wq_a and wkv, the shared
  // expert's w1 and w3.
  virtual std::vector<Tensor> linears(const Tensor& x, const std::vector<const LinearWeight*>& ws);
  virtual Tensor linear_bf16(const Tensor& x, const uint16_t* w, int out, int in) = 0;  // bf16 x·Wᵀ, f32 accumulate → bf16
  virtual Tensor linear_f32(const Tensor& x, const uint16_t* w, int out, int in) = 0;   // f32(x)·f32(W)ᵀ → f32
  // linear_f32(x, w, out, in) for each (w, out), in order: the values of those calls (the default
  // makes them; a backend may run them in one launch). A layer's compressor projections.
  virtual std::vector<Tensor> linears_f32(const Tensor& x, const std::vector<std::pair<const uint16_t*, int>>& ws,
                                          int in);
  // [T,H·d] → [T,groups·rank]; wo_a BF16 or FP8_BLOCK, its FP8 values taken as the exact bf16 ones.
  virtual Tensor grouped_out_proj(const Tensor& o, const LinearWeight& wo_a, int groups, int rank) = 0;

  // Hyper-connections (SPEC §3.2, §3.8). With `norm` (bf16 [D]; may be null) hc_pre and hc_head return
  // rms_norm(x, norm, norm_eps) of their result x — the values of the two ops in sequence (the norm
  // that follows them in every block and before the head; a backend may fuse it).
  virtual Tensor hc_pre(const Tensor& X, const HyperConnection& hc, int hc_mult, int iters, float norm_eps,
                        float hc_eps, Tensor* post, Tensor* comb, const uint16_t* norm) = 0;
  virtual Tensor hc_post(const Tensor& y, const Tensor& X, const Tensor& post, const Tensor& comb) = 0;
  // hc_post then hc_pre of its result: *Xa = hc_post(y, X, *post, *comb), then hc_pre(*Xa, …) with
  // *post and *comb replaced by its own — the values of those two (the default runs them; a backend
  // may fuse them). Between a block's attention and its FFN, and between blocks.
  virtual Tensor hc_post_pre(const Tensor& y, const Tensor& X, Tensor* Xa, const HyperConnection& hc, int hc_mult,
                             int iters, float norm_eps, float hc_eps, Tensor* post, Tensor* comb, const uint16_t* norm);
  virtual Tensor hc_head(const Tensor& X, const HyperConnection& hc, int hc_mult, float norm_eps, float hc_eps,
                         const uint16_t* norm) = 0;

  // KV entries (SPEC §4.2): bf16 [n, head_dim] → the pool's FP8 layout, at global entry ids.
  // Pools grow by whole pages; existing entries keep their ids.
  virtual void grow_pool(EntryPool& pool, int64_t pages) = 0;
  // Writes row r of `values` (bf16 [n, width]) as entry entries[r] (I32 [n], −1 = skip) of the
  // pool's kind: KV = 584-byte FP8 entries (lossless for FP8-simulated values), INDEX_KEY = e2m1 +
  // ue8m0 (lossless for FP4-simulated). Ids are checked on the host where the backend can read them.
  virtual void write_entries(const Tensor& values, const Tensor& entries, EntryPool& pool) = 0;
  // KV entry src[i] → dst[i] (I32 [n]; −1 on either side = skip).
  virtual void copy_entries(const Tensor& src, const Tensor& dst, EntryPool& pool) = 0;
  // The step's index work on the backend (StepIndexKind): I32 results.
  virtual Tensor step_indices(const StepIndexArgs& args) = 0;
  // step_indices of each description, in order: the values of those calls (the default makes them;
  // a backend may run them in one launch). A layer's entry ids, ring slots and lists.
  virtual std::vector<Tensor> step_index_sets(const std::vector<StepIndexArgs>& sets);

  // Sparse attention with sink over per-query entry lists (I32 [T, L], −1 = none), blocks of 64
  // list positions.
  virtual Tensor sparse_attention(const Tensor& q, int n_heads, int head_dim, const EntryPool& kv_pool,
                                  const Tensor& entry_lists, const float* sink, float scale) = 0;
  // Indexer (SPEC §3.5): per query, scores over its first counts[t] keys, top-k (ties: lower
  // position first). Returns I32 [T, k] positions within each query's keys (−1 where fewer).
  virtual Tensor indexer_topk(const Tensor& q, const Tensor& head_weights, int n_heads, const EntryPool& key_pool,
                              const KeyTables& keys, int k) = 0;

  // Compressor (SPEC §3.4). The states grow by slots, keeping their contents; a slot starts as
  // kv = 0, score = −inf. compressor_update consumes the projections (a, g: F32 [T, coff·d]) of
  // every span of the step in order (span s: rows row0.. at positions pos0.., state slot
  // slots[s], I32 [S]) and returns the pooled f32 rows of the entries the step completes, span
  // by span, in `capacity` rows (rows past them are 0: a fixed-shape step pads). max_span_rows
  // (the longest span) only chooses how the work is laid out.
  virtual void grow_compressor_states(CompressorStates& states, int64_t slots) = 0;
  virtual void compressor_state_init(CompressorStates& states, int64_t slot) = 0;
  virtual Tensor compressor_update(const Tensor& a, const Tensor& g, const StepTables& step, const Tensor& slots,
                                   int64_t capacity, int64_t max_span_rows, const float* ape,
                                   CompressorStates& states) = 0;
  virtual Tensor to_bf16(const Tensor& x) = 0;

  // MoE (SPEC §3.7).
  virtual Routing route(const Tensor& x, const MoeWeights& w, const Tensor& token_ids, int k,
                        float route_scale) = 0;  // token_ids I32 [T] (hash routing)
  // x is the input of the moe_experts call that follows on these weights (after route): a backend may
  // start the work that needs no routing now, beside the router (CUDA: the shared expert on a branch
  // for a decode step's rows). A hint: the default does nothing, and moe_experts is the same either way.
  virtual void moe_begin(const Tensor& x, const MoeWeights& w, float swiglu_limit) {}
  virtual Tensor moe_experts(const Tensor& x, const Routing& r, const MoeWeights& w, float swiglu_limit) = 0;

  // Tensor parallelism (docs/ARCHITECTURE.md "Tensor parallelism"): what a rank computes before
  // the one bf16 rounding of a split op, so the ranks' f32 partials are summed (all-reduce) and
  // rounded once, as the unsplit op rounds.
  // linear's f32 result before its bf16 rounding (the same per-block sums): F32 [rows, w.out].
  virtual Tensor linear_partial(const Tensor& x, const LinearWeight& w) = 0;
  // This rank's part of the MoE (SPEC §3.7) before any rounding: F32 [T, k + 1, D]. Slot j < k:
  // routed pair (t, j)'s w2 output — the rank's partial over its slice of the intermediate
  // dimension, the whole product where the rank holds that expert (w.expert_begin …), 0 where it
  // does not. Slot k: the shared expert's partial. Summed over the ranks, each slot is the f32
  // value the unsplit op rounds to bf16.
  virtual Tensor moe_expert_partials(const Tensor& x, const Routing& r, const MoeWeights& w, float swiglu_limit) = 0;
  // The summed partials → bf16 [T, D], as moe_experts ends: every slot rounded to bf16 (the
  // reference's y_e), routed slots summed in f32 in expert-id order, then the shared expert,
  // rounded once. moe_combine(moe_expert_partials(...)) on unsplit weights = moe_experts, bit for bit.
  virtual Tensor moe_combine(const Tensor& partials, const Routing& r) = 0;

  // Head.
  virtual Tensor logits(const Tensor& h, const uint16_t* head, int vocab) = 0;  // f32 [T, V]
  // One token per row of f32 logits [rows, V] (I32 [rows] out) with that row's parameters
  // (`params`: SamplingParams [rows], as bytes); counters[r] (U64 as I32 pairs) = tokens the row's
  // sequence has generated so far (the draw's counter). cpu/sampling_reference.h defines the
  // algorithm exactly, so every backend picks the same tokens.
  virtual Tensor sample(const Tensor& logits, const Tensor& params, const Tensor& counters) = 0;
  // Penalties (sampling_params.h) on f32 logits [rows, V] in place: entry e rewrites logit
  // ids[e] of row rows[e] through sampling::penalized_logit with params[rows[e]] and counts[e]
  // (I32 [n] each; ids distinct within a row; `params`: PenaltyParams [rows] as bytes). Exact: the
  // same bits on every backend, so penalised sampling picks the same tokens everywhere.
  virtual void apply_penalties(Tensor& logits, const Tensor& params, const Tensor& rows, const Tensor& ids,
                               const Tensor& counts) = 0;
  // Per row of f32 logits [rows, V]: the logprob of chosen[r] (I32 [rows]) and of the row's top_n
  // (≤ 32) tokens (cpu/sampling_reference.h: logprobs_reference; agreement to rounding).
  virtual LogprobRows logprobs(const Tensor& logits, const Tensor& chosen, int top_n) = 0;

 private:
  std::vector<double> host_marks_ms_;
};

// "cpu" | "cuda"; `device`: the GPU of a CUDA backend (a tensor-parallel rank's), made the calling
// thread's current device.
std::unique_ptr<Backend> make_backend(const std::string& name, int device = 0);
// Why `--backend cuda` cannot run here, as one line for the user ("" when it can): this build has
// no CUDA backend, or no CUDA device is visible (with the driver's reason, never a source path).
std::string cuda_unavailable_reason();

// An I32 tensor with `values` (tests and one-off host metadata).
Tensor upload_i32(Backend& be, const std::vector<int32_t>& values);

}  // namespace dsv4
