// CUDA backend: cache entries, sparse attention with sink, the indexer and the compressors
// (SPEC §3.4–§3.6, §4.2), on the kernels of kv_cache.cu, sparse_mla_*.cu, indexer_topk.cu and
// compressor.cu.
#include <cuda_bf16.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <string>

#include "backend/cuda/compressor.h"
#include "backend/cuda/device_limits.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/step_indices.h"
#include "backend/cuda/indexer_topk.h"
#include "backend/cuda/kv_cache.h"
#include "backend/cuda/sparse_mla_decode.h"
#include "backend/kv_cache_layout.h"
#include "core/error.h"

namespace dsv4::cuda {

namespace kl = dsv4::kv_layout;

namespace {
size_t page_bytes(EntryKind kind) { return kind == EntryKind::KV ? kl::kKvPageBytes : kl::kIndexFp4PageBytes; }

// Copies the first min(src_heads, dst_heads) heads (`head_bytes` each) of `rows` rows between
// rows of different head counts: the zero-head padding of the fixed-head kernels, and back.
void copy_heads(void* dst, int dst_heads, const void* src, int src_heads, int64_t rows, size_t head_bytes,
                cudaStream_t stream) {
  const size_t width = size_t(std::min(src_heads, dst_heads)) * head_bytes;
  DSV4_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_heads * head_bytes, src, src_heads * head_bytes, width, size_t(rows),
                                    cudaMemcpyDeviceToDevice, stream));
}
}  // namespace

void CudaBackend::grow_pool(EntryPool& pool, int64_t pages) {
  if (pages <= pool.pages) return;
  Tensor bigger = alloc_state(DType::U8, {pages * int64_t(page_bytes(pool.kind))});
  DSV4_CUDA_CHECK(cudaMemsetAsync(bigger.data, 0, bigger.nbytes(), stream()));
  if (pool.storage.data)
    DSV4_CUDA_CHECK(cudaMemcpyAsync(bigger.data, pool.storage.data, pool.storage.nbytes(), cudaMemcpyDeviceToDevice,
                                    stream()));
  pool.storage = std::move(bigger);  // the old storage's cudaFree waits for the copy
  pool.pages = pages;
  ++epoch_;
}

void CudaBackend::write_entries(const Tensor& values, const Tensor& entries, EntryPool& pool) {
  const int64_t n = values.rows();
  if (!n) return;
  DSV4_CHECK(entries.numel() == n && entries.dtype == DType::I32, "write_entries: {} entry ids for {} rows", entries.numel(), n);
  const int64_t width = values.numel() / n;
  const auto* v = reinterpret_cast<const __nv_bfloat16*>(values.data);
  if (pool.kind == EntryKind::KV) {
    DSV4_CHECK(width == kl::kHeadDim, "KV entries are {} wide, got {}", kl::kHeadDim, width);
    append_kv_entries(v, entries.ptr<int32_t>(), int(n), pool.storage.ptr<uint8_t>(), stream());
  } else {
    DSV4_CHECK(width == kl::kIndexDim, "indexer keys are {} wide, got {}", kl::kIndexDim, width);
    append_index_keys_fp4(v, entries.ptr<int32_t>(), int(n), pool.storage.ptr<uint8_t>(), stream());
  }
}

void CudaBackend::copy_entries(const Tensor& src, const Tensor& dst, EntryPool& pool) {
  DSV4_CHECK(pool.kind == EntryKind::KV, "copy_entries: KV pools only");
  DSV4_CHECK(src.numel() == dst.numel(), "copy_entries: {} sources, {} destinations", src.numel(), dst.numel());
  if (!src.data || !src.numel()) return;
  copy_kv_entries(src.ptr<int32_t>(), dst.ptr<int32_t>(), int(src.numel()), pool.storage.ptr<uint8_t>(), stream());
}

Tensor CudaBackend::step_indices(const StepIndexArgs& args) { return step_index_sets({args})[0]; }

std::vector<Tensor> CudaBackend::step_index_sets(const std::vector<StepIndexArgs>& sets) {
  std::vector<Tensor> out;
  for (size_t k0 = 0; k0 < sets.size(); k0 += kMaxStepIndexSets) {
    const int n = int(std::min<size_t>(sets.size() - k0, kMaxStepIndexSets));
    cpu::StepIndexArrays a[kMaxStepIndexSets];
    int32_t* ptr[kMaxStepIndexSets] = {};
    for (int k = 0; k < n; ++k) {
      a[k] = cpu::step_index_arrays(sets[k0 + size_t(k)]);
      Tensor t = alloc(DType::I32, {cpu::step_indices_size(a[k])});
      if (a[k].kind == StepIndexKind::AttentionLists) t.shape = {a[k].rows, a[k].window_size + a[k].count};
      ptr[k] = t.ptr<int32_t>();
      out.push_back(std::move(t));
    }
    cuda::step_indices(a, ptr, n, stream());
  }
  return out;
}

SparseMlaPlan& CudaBackend::attention_plan(int queries, int heads, int list_len) {
  // One plan per power-of-two query bucket (a plan sizes its partials for its maximum) and mode.
  const int bucket = int(std::bit_ceil(unsigned(std::max(queries, 1))));
  // Split-KV with the reference's rounding where it pays: the reference's online softmax rounds
  // each block's P to bf16 relative to the running maximum over all earlier blocks; split pieces
  // that started from their own maximum moved chaotic fixture layers from 0.7% to 1.6% (whole
  // prompt) and 3.1% (decode) against the golden streams, past the 3% tolerance
  // (docs/perf/2026-12-01-cuda-forward.md), so every piece starts from the maximum of the blocks
  // before it (a first pass over Q·Kᵀ, SparseMlaShape::reference_rounding). That costs a launch:
  // on the H200 it won for long lists at few queries (640 entries: 75 → 30 µs at 1 query, 80 → 50
  // at 16) and lost for 128–160 entries (21 → 28 µs at 1) and at 64 queries (81 → 89 µs), so it
  // runs for lists of more than 256 entries at up to 16 queries (docs/perf/2026-12-01-split-attention.md).
  // DSV4_ATTN_SPLIT=0 | 1 | plain: never split | always (reference rounding) | always, pieces from
  // their own maximum (measurements).
  bool split = list_len > 256 && bucket <= 16, reference_rounding = true;
  if (const char* e = std::getenv("DSV4_ATTN_SPLIT")) {
    const std::string v = e;
    DSV4_CHECK(v == "0" || v == "1" || v == "plain", "DSV4_ATTN_SPLIT={}: expected 0, 1 or plain", v);
    split = v != "0";
    reference_rounding = v == "1";
  }
  auto& plan = plans_[{bucket, heads, split}];
  if (!plan) {
    SparseMlaShape shape;
    shape.max_queries = bucket;
    shape.n_heads = heads;
    shape.split_kv = split;
    shape.reference_rounding = split && reference_rounding;
    // Softmax blocks of 64 list positions, the reference's (SPEC §3.6; the bf16 rounding of P is
    // relative to each block's running maximum, so 32-entry blocks round differently — on the
    // fixtures enough to move a chaotic layer past the golden tolerance). Only where no 64-entry
    // tile fits (sm_120's 99 KB) does the plan fall back to 32.
    shape.block_entries = 64;
    // Unsplit lists at up to 16 queries (the window's 128 entries): one CTA per query and 16-head
    // group, else 16 queries ran on 16 CTAs of 64 heads (24.6 µs on the H200 for the window at 16
    // queries). A head's arithmetic does not depend on the heads beside it in the tile.
    if (!split && bucket <= 16) shape.heads_per_cta = 16;
    try {
      (void)sparse_mla_select_tile(shape, current_device_limits());
    } catch (const Error&) {
      shape.block_entries = 0;
    }
    plan = std::make_unique<SparseMlaPlan>(shape);
  }
  return *plan;
}

Tensor CudaBackend::sparse_attention(const Tensor& q, int n_heads, int head_dim, const EntryPool& kv_pool,
                                     const Tensor& entry_lists, const float* sink, float scale) {
  DSV4_CHECK(head_dim == kl::kHeadDim, "sparse_attention: head_dim {}", head_dim);
  const int64_t T = q.rows();
  Tensor out = alloc(DType::BF16, {T, n_heads, head_dim});
  if (!T) return out;
  DSV4_CHECK(entry_lists.rows() == T && entry_lists.shape.size() == 2 && entry_lists.dtype == DType::I32,
             "sparse_attention: lists of {} rows for {} queries", entry_lists.rows(), T);
  const int list_len = int(entry_lists.shape[1]);
  const int heads = n_heads <= 16 ? 16 : n_heads <= 32 ? 32 : 64;
  DSV4_CHECK(n_heads <= 64, "sparse_attention: {} heads per rank (at most 64)", n_heads);
  const size_t head_bytes = size_t(head_dim) * 2;
  Tensor qp = q, op = out, sinkp;
  const float* sink_used = sink;
  if (heads != n_heads) {
    qp = alloc(DType::BF16, {T, heads, head_dim});
    op = alloc(DType::BF16, {T, heads, head_dim});
    DSV4_CUDA_CHECK(cudaMemsetAsync(qp.data, 0, qp.nbytes(), stream()));
    copy_heads(qp.data, heads, q.data, n_heads, T, head_bytes, stream());
    sinkp = alloc(DType::F32, {heads});
    DSV4_CUDA_CHECK(cudaMemsetAsync(sinkp.data, 0, sinkp.nbytes(), stream()));
    DSV4_CUDA_CHECK(cudaMemcpyAsync(sinkp.data, sink, size_t(n_heads) * 4, cudaMemcpyDeviceToDevice, stream()));
    sink_used = sinkp.ptr<float>();
  }
  SparseMlaPlan& plan = attention_plan(int(T), heads, list_len);
  plan.compute_once(int(T), list_len, stream());
  SparseMlaArgs a;
  a.q = reinterpret_cast<const __nv_bfloat16*>(qp.data);
  a.window_pool = a.compressed_pool = kv_pool.storage.ptr<uint8_t>();
  a.lists = entry_lists.ptr<int32_t>();
  a.list_stride = list_len;
  a.window_len = std::min(list_len, 128);
  a.sink = sink_used;
  a.scale = scale;
  a.out = reinterpret_cast<__nv_bfloat16*>(op.data);
  a.num_queries = int(T);
  sparse_mla_decode(plan, a, stream());
  if (heads != n_heads) copy_heads(out.data, n_heads, op.data, heads, T, head_bytes, stream());
  return out;
}

IndexerWorkspace& CudaBackend::indexer_workspace(int queries, int keys) {
  if (!indexer_ws_ || indexer_ws_->max_queries() < queries || indexer_ws_->max_keys() < keys) {
    const int q = int(std::bit_ceil(unsigned(std::max({queries, 1, indexer_ws_ ? indexer_ws_->max_queries() : 1}))));
    const int k = int(std::bit_ceil(unsigned(std::max({keys, 64, indexer_ws_ ? indexer_ws_->max_keys() : 1}))));
    stream_.sync();  // the old workspace may still be read by queued work
    indexer_ws_ = std::make_unique<IndexerWorkspace>(q, k);
    ++epoch_;
  }
  return *indexer_ws_;
}

Tensor CudaBackend::indexer_topk(const Tensor& q, const Tensor& head_weights, int n_heads, const EntryPool& key_pool,
                                 const KeyTables& keys, int k) {
  constexpr int d = kl::kIndexDim;
  const int64_t T = q.rows();
  Tensor out = alloc(DType::I32, {T, k});
  if (!T) return out;
  DSV4_CHECK(n_heads <= kIndexerHeads, "indexer: {} heads (the kernel has {})", n_heads, kIndexerHeads);
  DSV4_CHECK(k <= kIndexerMaxTopk, "indexer: top-{} (at most {})", k, kIndexerMaxTopk);
  DSV4_CHECK(keys.query_span.numel() == T && keys.counts.numel() == T && keys.pages.shape.size() == 2,
             "indexer: key tables for {} queries", T);
  Tensor qp = q, wp = head_weights;
  if (n_heads != kIndexerHeads) {
    qp = alloc(DType::BF16, {T, kIndexerHeads, d});
    wp = alloc(DType::BF16, {T, kIndexerHeads});
    DSV4_CUDA_CHECK(cudaMemsetAsync(qp.data, 0, qp.nbytes(), stream()));
    DSV4_CUDA_CHECK(cudaMemsetAsync(wp.data, 0, wp.nbytes(), stream()));
    copy_heads(qp.data, kIndexerHeads, q.data, n_heads, T, size_t(d) * 2, stream());
    copy_heads(wp.data, kIndexerHeads, head_weights.data, n_heads, T, 2, stream());
  }
  IndexerArgs a;
  a.q = reinterpret_cast<const __nv_bfloat16*>(qp.data);
  a.weights = reinterpret_cast<const __nv_bfloat16*>(wp.data);
  a.key_pool = key_pool.storage.ptr<uint8_t>();
  a.block_table = keys.pages.ptr<int32_t>();
  a.pages_stride = int(keys.pages.shape[1]);
  a.query_seq = keys.query_span.ptr<int32_t>();
  a.key_counts = keys.counts.ptr<int32_t>();
  a.num_queries = int(T);
  a.max_keys = std::max(keys.max_keys, 1);
  a.k = k;
  a.topk = out.ptr<int32_t>();
  cuda::indexer_topk(indexer_workspace(int(T), a.max_keys), a, stream());
  return out;
}

void CudaBackend::grow_compressor_states(CompressorStates& states, int64_t slots) {
  if (slots <= states.slots) return;
  const int coff = states.ratio == 4 ? 2 : 1;
  for (Tensor* t : {&states.kv, &states.score}) {
    Tensor bigger = alloc_state(DType::F32, {slots, coff * states.ratio, coff * states.d});
    if (t->data) DSV4_CUDA_CHECK(cudaMemcpyAsync(bigger.data, t->data, t->nbytes(), cudaMemcpyDeviceToDevice, stream()));
    *t = std::move(bigger);  // the old state's cudaFree waits for the copy
  }
  states.slots = slots;
  ++epoch_;
}

void CudaBackend::compressor_state_init(CompressorStates& states, int64_t slot) {
  DSV4_CHECK(slot >= 0 && slot < states.slots, "compressor_state_init: slot {} of {}", slot, states.slots);
  const int64_t n = states.slot_floats();
  cuda::compressor_state_init(states.kv.ptr<float>() + slot * n, states.score.ptr<float>() + slot * n, states.ratio,
                              states.d, stream());
}

Tensor CudaBackend::compressor_update(const Tensor& a, const Tensor& g, const StepTables& step, const Tensor& slots,
                                      int64_t capacity, int64_t max_span_rows, const float* ape, CompressorStates& states) {
  const int64_t S = step.spans.rows();
  DSV4_CHECK(slots.numel() == S && slots.dtype == DType::I32, "compressor_update: {} state slots for {} spans",
             slots.numel(), S);
  Tensor out = alloc(DType::F32, {capacity, states.d});
  cuda::compressor_update(a.ptr<float>(), g.ptr<float>(), step.spans.ptr<int32_t>(), slots.ptr<int32_t>(), S,
                          max_span_rows, ape, states.ratio, states.d, states.kv.ptr<float>(), states.score.ptr<float>(),
                          out.ptr<float>(), capacity, stream());
  return out;
}

}  // namespace dsv4::cuda
