// DeepSeek-V4 sparse attention with sink at decode (SPEC §3.6) over the FP8 paged KV cache
// (backend/kv_cache_layout.h): split-KV tensor-core kernel, its device-side scheduling plan and the
// combine step. Device pointers in and out, no host synchronisation, CUDA-graph capturable.
//
// Per step the model calls:
//   build_sparse_mla_lists(...)            once per layer kind (SWA / CSA / HCA): entry lists
//   plan.compute(list_lengths, T, stream)  once per layer kind: split plan, reused by its layers
//   or plan.compute_once(T, stride, stream) lists walked to their stride: computed once, then reused
//   sparse_mla_decode(plan, args, stream)  per layer
// Numerics follow the reference kernel (cpu/sparse_mla_reference.h): f32 scores, online softmax in
// f32 over blocks of 64 list positions (32 in the small-batch configuration), probabilities rounded
// to bf16 before P·V, f32 accumulation, bf16 output. Split boundaries fall on those blocks; the
// combine rescales exactly.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/device_limits.h"

namespace dsv4::cuda {

// Which decode kernel runs: mma.sync (every GPU, every tile shape) or wgmma (sm_90a: 64 heads ×
// 64-entry blocks, warp-specialised, split-KV with the separate combine).
enum class SparseMlaKernel { Auto, MmaSync, Wgmma };

// Sizes fixed when a plan is made (per batch-size bucket of a captured graph).
struct SparseMlaShape {
  int max_queries = 1;    // query tokens per call (batch × s_q), upper bound
  int n_heads = 64;       // 64, or 32 / 16 on tensor-parallel ranks
  int heads_per_cta = 0;  // 16, 32 or 64 (≤ n_heads); 0 = chosen from max_queries
  int block_entries = 0;  // list positions per work unit and softmax block: 64 or 32; 0 = chosen from
                          // max_queries (and 32 where a 64-entry tile does not fit the GPU's smem)
  int row_group_warps = 0;  // warps per 16-head row group (2, 4, or 8 with 16 heads × 64 entries: S's
                            // entries and O's dims are split among them); 0 = 8 for 16 heads × 64
                            // entries, else 4, or 2 with the fused combine (which needs 2)
  bool split_kv = true;   // false: one CTA per (query, head group) over its whole list (baseline)
  // The last CTA of a split job merges its partials, else a separate combine kernel does. Off by
  // default: on the H200 the separate kernel measured 3.5–4× faster at batch 1–32 and within 5% at
  // 128 (docs/perf/2026-11-29-gpu-check.md).
  bool fused_combine = false;
  // Split pieces round P as one walk over the whole list would (the reference's online softmax):
  // a first pass of the same kernel over Q·Kᵀ finds each piece's score maximum, and every piece then
  // starts from the running maximum of the blocks before it instead of −inf, so each block's P is
  // rounded to bf16 against the same maximum as in the unsplit kernel. Split-KV with the separate
  // combine, mma.sync only (the wgmma kernel does not take it).
  bool reference_rounding = false;
  // Auto: wgmma where it can run (an sm_90 GPU, n_heads 64, split-KV, separate combine, tile not
  // forced to another shape) and max_queries ≥ 2; otherwise mma.sync. Forcing Wgmma where it cannot
  // run is an error.
  SparseMlaKernel kernel = SparseMlaKernel::Auto;
};

// The kernel and tile a plan runs, and what one CTA asks of the GPU.
struct SparseMlaTile {
  bool wgmma = false;       // the sm_90a kernel (64 heads × 64 entries), else mma.sync
  int heads_per_cta = 0, block_entries = 0, row_group_warps = 0;  // row_group_warps: mma.sync only
  int threads = 0;          // per CTA
  size_t smem_bytes = 0;    // dynamic shared memory per CTA
};
// The choice SparseMlaPlan makes for `shape` on a device with `limits`; host code, no GPU needed.
// Auto takes wgmma where it can run (limits.is_sm90() && limits.sm90a_code, see SparseMlaShape);
// the mma.sync tile follows the shape's rules, and where its shared memory exceeds the per-block
// limit (sm_120: 99 KB) falls back to 32-entry blocks, then to smaller head groups, for each field
// the shape leaves at 0. Fails where a forced shape cannot run on that device.
SparseMlaTile sparse_mla_select_tile(const SparseMlaShape& shape, const DeviceLimits& limits);
// Threads and dynamic shared memory of one mma.sync tile (sparse_mla_decode.cu) and of the wgmma
// kernel (sparse_mla_decode_wgmma.cu).
SparseMlaTile sparse_mla_mma_tile(int heads_per_cta, int block_entries, int row_group_warps);
SparseMlaTile sparse_mla_wgmma_tile();
// Every kernel the sparse-MLA code may launch on a device with `limits` (each decode tile any
// valid shape selects there, the combine, plan and list kernels), for the resource test.
std::vector<KernelLaunch> sparse_mla_kernel_launches(const DeviceLimits& limits);

// The device-side schedule (FlashMLA-style metadata) and the split partials. Work unit = one block
// of block_entries() positions of one (query, head group) job; CTA c of a fixed grid takes units
// [c·P, (c+1)·P) of the concatenated jobs, P = ceil(total / grid). Jobs cut by a CTA boundary
// write f32 partials that the combine kernel merges.
class SparseMlaPlan {
 public:
  explicit SparseMlaPlan(const SparseMlaShape& shape);
  SparseMlaPlan(const SparseMlaPlan&) = delete;
  SparseMlaPlan& operator=(const SparseMlaPlan&) = delete;

  // Computes the schedule on the device from the list lengths (device [num_queries], nullptr =
  // every list walked to list_stride). Reusable by every layer whose lists have these lengths.
  void compute(const int32_t* list_lengths, int num_queries, int list_stride, cudaStream_t stream);
  // The schedule of num_queries lists walked to list_stride: a function of the two numbers alone,
  // so it is computed once per pair into its own tables and later calls only select them. A
  // recorded decode step then replays no plan kernel: at one query it was ~3 µs on the chain of
  // every CSA layer (docs/perf/2026-12-06-plan-once.md). A pair first met while the stream records
  // is computed into the shared tables, in the recording (no allocation while recording).
  void compute_once(int num_queries, int list_stride, cudaStream_t stream);

  const SparseMlaShape& shape() const { return shape_; }
  int heads_per_cta() const { return heads_per_cta_; }
  int block_entries() const { return block_entries_; }
  int row_group_warps() const { return row_group_warps_; }
  int grid_ctas() const { return grid_ctas_; }  // CTAs the decode kernel launches ("SMs busy" bound)
  bool wgmma() const { return wgmma_; }          // the sm_90a kernel runs (else mma.sync)

  // Device state used by the kernels.
  struct View {
    const int32_t* meta;         // [0] units per CTA, [1] total units
    const int32_t* job_unit_start;   // [jobs + 1]
    const int32_t* job_first_piece;  // [jobs + 1]
    const int4* cta_first_piece;     // [grid] the CTA's first piece: job, first and end block in the
                                     // job, partial slot (−1: whole job); job −1: no work
    float* partial_acc;          // [max_pieces, heads_per_cta, 512]
    float2* partial_ml;          // [max_pieces, heads_per_cta] (running max, sum)
    float* piece_max;            // [max_pieces, heads_per_cta] reference_rounding: each piece's score maximum
    int32_t* job_done;           // [jobs] pieces finished (fused combine); the last CTA resets it to 0
    int num_jobs;
    // The four tables above were written by a plan launch of an earlier call (compute_once's tables
    // met again: whole layers of kernels, or steps, ago), so the kernels read them before their
    // programmatic wait.
    bool settled;
  };
  View view() const;

 private:
  SparseMlaShape shape_;
  int heads_per_cta_ = 64;
  int block_entries_ = 64;
  int row_group_warps_ = 4;
  int grid_ctas_ = 0;
  int num_jobs_ = 0;
  bool wgmma_ = false;
  struct Tables {
    DeviceBuffer<int32_t> meta, job_unit_start, job_first_piece;
    DeviceBuffer<int4> cta_first_piece;
  };
  Tables make_tables() const;
  void launch(const int32_t* list_lengths, int num_queries, int list_stride, const Tables& t, cudaStream_t stream);
  Tables computed_;                                   // compute()'s, and compute_once()'s while recording
  std::map<std::pair<int, int>, Tables> once_;        // (num_queries, list_stride) → its schedule
  const Tables* current_ = &computed_;                // the tables view() hands out
  bool settled_ = false;                              // View::settled
  DeviceBuffer<int32_t> job_done_;
  DeviceBuffer<float> partial_acc_;
  DeviceBuffer<float2> partial_ml_;
  DeviceBuffer<float> piece_max_;
};

struct SparseMlaArgs {
  const __nv_bfloat16* q = nullptr;      // [num_queries, n_heads, 512]
  const uint8_t* window_pool = nullptr;  // KV pool for list positions [0, window_len)
  const uint8_t* compressed_pool = nullptr;  // KV pool for the rest (may equal window_pool)
  const int32_t* lists = nullptr;        // [num_queries, list_stride] global entry ids, −1 = none
  const int32_t* list_lengths = nullptr; // [num_queries] or nullptr (= list_stride); must match the plan's
  int list_stride = 0;
  int window_len = 128;
  const float* sink = nullptr;           // [n_heads] attention-sink logits
  float scale = 0.044194173824159216f;   // 512^-0.5
  __nv_bfloat16* out = nullptr;          // [num_queries, n_heads, 512]
  int num_queries = 0;
};

// Whether SparseMlaKernel::Wgmma can run on this GPU (sm_90 with the sm_90a build).
bool sparse_mla_wgmma_available();

// Attention for every query token (the plan must have been computed for these lengths).
void sparse_mla_decode(const SparseMlaPlan& plan, const SparseMlaArgs& args, cudaStream_t stream);

// Which compressed entries the lists hold after the 128-position window (SPEC §3.6).
enum class SparseMlaCompressed { None, Selected, All };

// Builds the entry lists of SPEC §3.6 on the device (twin of cpu::build_sparse_mla_lists_reference):
// positions [0,128) = window positions max(0,i−127)…i ascending (ring slot = position mod
// window_pages·64), then compressed_capacity positions: Selected = topk entry numbers mapped through
// the compressed block table, All = entries 0 … floor((i+1)/ratio)−1; −1 padded.
// lengths[t] = 128 + compressed entries used. lists: [num_queries, 128 + compressed_capacity].
struct SparseMlaListArgs {
  int num_queries = 0;
  const int32_t* query_seq = nullptr;   // [num_queries]
  const int32_t* query_pos = nullptr;   // [num_queries]
  const int32_t* window_block_table = nullptr;  // [num_seqs, window_pages]
  int window_pages = 2;
  const int32_t* compressed_block_table = nullptr;  // [num_seqs, compressed_pages_stride]
  int compressed_pages_stride = 0;
  SparseMlaCompressed set = SparseMlaCompressed::None;
  const int32_t* topk = nullptr;  // Selected: [num_queries, topk_stride]
  int topk_stride = 0;
  int ratio = 4;
  int compressed_capacity = 0;
  int32_t* lists = nullptr;
  int32_t* lengths = nullptr;
};
void build_sparse_mla_lists(const SparseMlaListArgs& args, cudaStream_t stream);

}  // namespace dsv4::cuda
