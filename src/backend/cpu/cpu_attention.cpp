// Cache entries, sparse attention with sink, the lightning indexer's scores and top-k, and the
// KV compressors, on the CPU (SPEC §3.4–§3.6, §4.2).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/indexer_reference.h"
#include "backend/cpu/sparse_mla_reference.h"
#include "backend/cpu/step_indices_reference.h"
#include "backend/kv_cache_layout.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace dsv4 {

namespace {
size_t page_bytes(EntryKind kind) {
  return kind == EntryKind::KV ? kv_layout::kKvPageBytes : kv_layout::kIndexFp4PageBytes;
}
}  // namespace

void CpuBackend::grow_pool(EntryPool& pool, int64_t pages) {
  if (pages <= pool.pages) return;
  Tensor bigger = alloc(DType::U8, {pages * int64_t(page_bytes(pool.kind))});
  std::memset(bigger.data, 0, bigger.nbytes());
  if (pool.storage.data) std::memcpy(bigger.data, pool.storage.data, pool.storage.nbytes());
  pool.storage = std::move(bigger);
  pool.pages = pages;
}

void CpuBackend::write_entries(const Tensor& values, const Tensor& entries, EntryPool& pool) {
  const int64_t n = values.rows();
  DSV4_CHECK(entries.numel() == n, "write_entries: {} entry ids for {} rows", entries.numel(), n);
  if (!n) return;
  const int64_t width = values.numel() / n;
  uint8_t* base = pool.storage.ptr<uint8_t>();
  for (int64_t r = 0; r < n; ++r) {
    const int64_t e = entries.ptr<int32_t>()[r];
    if (e < 0) continue;
    DSV4_CHECK(e < pool.pages * kv_layout::kEntriesPerPage, "entry {} outside the pool", e);
    const uint16_t* v = values.ptr<uint16_t>() + r * width;
    float f[kv_layout::kHeadDim];
    for (int64_t c = 0; c < width; ++c) f[c] = bf16_to_f32(v[c]);
    if (pool.kind == EntryKind::KV) {
      DSV4_CHECK(width == kv_layout::kHeadDim, "KV entries are {} wide, got {}", kv_layout::kHeadDim, width);
      kv_layout::encode_kv_entry_at(base, e, f);
    } else {
      DSV4_CHECK(width == kv_layout::kIndexDim, "indexer keys are {} wide, got {}", kv_layout::kIndexDim, width);
      kv_layout::encode_index_key_fp4_at(base, e, f);
    }
  }
}

void CpuBackend::copy_entries(const Tensor& src, const Tensor& dst, EntryPool& pool) {
  DSV4_CHECK(pool.kind == EntryKind::KV, "copy_entries: KV pools only");
  DSV4_CHECK(src.numel() == dst.numel(), "copy_entries: {} sources, {} destinations", src.numel(), dst.numel());
  uint8_t* base = pool.storage.ptr<uint8_t>();
  const int64_t limit = pool.pages * kv_layout::kEntriesPerPage;
  for (int64_t i = 0; i < src.numel(); ++i) {
    const int64_t s = src.ptr<int32_t>()[i], d = dst.ptr<int32_t>()[i];
    if (s < 0 || d < 0) continue;
    DSV4_CHECK(s < limit && d < limit, "copy_entries: entry {} → {} outside the pool", s, d);
    std::memmove(base + kv_layout::kv_entry_data_offset(d), base + kv_layout::kv_entry_data_offset(s),
                 kv_layout::kEntryDataBytes);
    std::memmove(base + kv_layout::kv_entry_scale_offset(d), base + kv_layout::kv_entry_scale_offset(s),
                 kv_layout::kEntryScaleBytes);
  }
}

Tensor CpuBackend::step_indices(const StepIndexArgs& args) {
  const cpu::StepIndexArrays a = cpu::step_index_arrays(args);
  Tensor out = alloc(DType::I32, {cpu::step_indices_size(a)});
  cpu::step_indices_reference(a, out.ptr<int32_t>());
  if (args.kind == StepIndexKind::AttentionLists) out.shape = {a.rows, a.window_size + a.count};
  return out;
}

Tensor CpuBackend::sparse_attention(const Tensor& q, int n_heads, int head_dim, const EntryPool& kv_pool,
                                    const Tensor& entry_lists, const float* sink, float scale) {
  // SPEC §3.6 with the reference kernel's schedule (blocks of 64 list positions, online softmax in
  // f32, bf16 probabilities before P·V, sink in the denominator): the same CPU reference the CUDA
  // kernel is tested against, run over row ranges in parallel.
  DSV4_CHECK(head_dim == kv_layout::kHeadDim, "sparse_attention: head_dim {}", head_dim);
  const int64_t T = q.rows();
  Tensor out = alloc(DType::BF16, {T, n_heads, head_dim});
  if (!T) return out;
  DSV4_CHECK(entry_lists.rows() == T && entry_lists.shape.size() == 2, "sparse_attention: lists of {} rows for {} queries",
             entry_lists.rows(), T);
  const int list_len = int(entry_lists.shape[1]);
  const int32_t* lists = entry_lists.ptr<int32_t>();
  const uint8_t* base = kv_pool.storage.ptr<uint8_t>();
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    cpu::SparseMlaLists l{lists + t0 * list_len, nullptr, list_len, list_len};
    const size_t row = size_t(n_heads) * size_t(head_dim);
    cpu::sparse_mla_decode_reference(q.ptr<uint16_t>() + size_t(t0) * row, int(t1 - t0), n_heads, base, base, l, sink, scale,
                                     out.ptr<uint16_t>() + size_t(t0) * row);
  });
  return out;
}

Tensor CpuBackend::indexer_topk(const Tensor& q, const Tensor& head_weights, int n_heads, const EntryPool& key_pool,
                                const KeyTables& keys_in, int k) {
  // SPEC §3.5 with the reference's bf16 rounding points, through the CPU reference the CUDA
  // indexer is tested against (cpu/indexer_reference.h).
  const int64_t T = q.rows();
  constexpr int d = kv_layout::kIndexDim;
  Tensor out = alloc(DType::I32, {T, k});
  const uint8_t* base = key_pool.storage.ptr<uint8_t>();
  const int64_t width = keys_in.pages.rows() ? keys_in.pages.numel() / keys_in.pages.rows() : 0;
  const int32_t* pages = keys_in.pages.ptr<int32_t>();
  const int64_t limit = key_pool.pages * kv_layout::kEntriesPerPage;
  parallel_for(T, [&](int64_t t0, int64_t t1) {
    std::vector<float> keys, scores;
    for (int64_t t = t0; t < t1; ++t) {
      const int n = keys_in.counts.ptr<int32_t>()[t];
      const int64_t s = keys_in.query_span.ptr<int32_t>()[t];
      DSV4_CHECK(n <= keys_in.max_keys && (n + kv_layout::kEntriesPerPage - 1) / kv_layout::kEntriesPerPage <= width,
                 "indexer: query {} has {} keys, its table {} pages", t, n, width);
      keys.resize(size_t(n) * d);
      scores.resize(size_t(n));
      for (int j = 0; j < n; ++j) {
        const int64_t e = int64_t(pages[s * width + j / kv_layout::kEntriesPerPage]) * kv_layout::kEntriesPerPage +
                          j % kv_layout::kEntriesPerPage;
        DSV4_CHECK(e >= 0 && e < limit, "indexer: key entry {} outside the pool", e);
        kv_layout::decode_index_key_fp4_at(base, e, keys.data() + size_t(j) * d);
      }
      cpu::indexer_scores_reference(q.ptr<uint16_t>() + t * n_heads * d, head_weights.ptr<uint16_t>() + t * n_heads,
                                    n_heads, keys.data(), n, scores.data());
      cpu::topk_reference(scores.data(), n, k, out.ptr<int32_t>() + t * k);
    }
  });
  return out;
}

void CpuBackend::grow_compressor_states(CompressorStates& states, int64_t slots) {
  if (slots <= states.slots) return;
  const int coff = states.ratio == 4 ? 2 : 1;
  for (Tensor* t : {&states.kv, &states.score}) {
    Tensor bigger = alloc(DType::F32, {slots, coff * states.ratio, coff * states.d});
    if (t->data) std::memcpy(bigger.data, t->data, t->nbytes());
    *t = std::move(bigger);
  }
  states.slots = slots;
}

void CpuBackend::compressor_state_init(CompressorStates& states, int64_t slot) {
  DSV4_CHECK(slot >= 0 && slot < states.slots, "compressor_state_init: slot {} of {}", slot, states.slots);
  const int64_t n = states.slot_floats();
  std::fill_n(states.kv.ptr<float>() + slot * n, n, 0.0f);
  std::fill_n(states.score.ptr<float>() + slot * n, n, -INFINITY);
}

Tensor CpuBackend::compressor_update(const Tensor& a, const Tensor& g, const StepTables& step, const Tensor& slots,
                                     int64_t capacity, int64_t, const float* ape, CompressorStates& states) {
  // SPEC §3.4, the reference's decode-path state machine, used for every chunk size (prefill of a
  // whole prompt computes the same softmax pools), span after span.
  const int ratio = states.ratio, d = states.d;
  const int coff = ratio == 4 ? 2 : 1;
  const int width = coff * d;
  const int64_t S = step.spans.rows();
  DSV4_CHECK(slots.numel() == S, "compressor_update: {} state slots for {} spans", slots.numel(), S);
  Tensor out = alloc(DType::F32, {capacity, d});
  std::fill_n(out.ptr<float>(), out.numel(), 0.0f);
  int64_t e = 0;
  std::vector<float> w(size_t(coff * ratio));
  for (int64_t s = 0; s < S; ++s) {
    const int32_t* sp = step.spans.ptr<int32_t>() + s * 3;
    const int64_t row0 = sp[0], n = sp[1], pos0 = sp[2], slot = slots.ptr<int32_t>()[s];
    DSV4_CHECK(slot >= 0 && slot < states.slots, "compressor_update: span {} names slot {} of {}", s, slot, states.slots);
    float* kv = states.kv.ptr<float>() + slot * states.slot_floats();
    float* sc = states.score.ptr<float>() + slot * states.slot_floats();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = pos0 + i;
      const int phase = int(pos % ratio);
      const int srow = (coff == 2 ? ratio : 0) + phase;
      const float* ar = a.ptr<float>() + (row0 + i) * width;
      const float* gr = g.ptr<float>() + (row0 + i) * width;
      for (int c = 0; c < width; ++c) {
        kv[srow * width + c] = ar[c];
        sc[srow * width + c] = gr[c] + ape[phase * width + c];
      }
      if (phase != ratio - 1) continue;
      DSV4_CHECK(e < capacity, "compressor_update: more than {} entries completed", capacity);
      float* u = out.ptr<float>() + e * d;
      const int rows = coff * ratio;
      for (int c = 0; c < d; ++c) {
        // Overlapping (ratio 4): rows 0..3 = previous window, first half; rows 4..7 = current, second half.
        auto col = [&](int r) { return coff == 2 ? (r < ratio ? c : d + c) : c; };
        float mx = -INFINITY;
        for (int r = 0; r < rows; ++r) mx = std::max(mx, sc[r * width + col(r)]);
        float sum = 0;
        for (int r = 0; r < rows; ++r) sum += (w[size_t(r)] = std::exp(sc[r * width + col(r)] - mx));
        float acc = 0;
        for (int r = 0; r < rows; ++r) acc += kv[r * width + col(r)] * (w[size_t(r)] / sum);
        u[c] = acc;
      }
      if (coff == 2) {
        std::memcpy(kv, kv + ratio * width, size_t(ratio) * size_t(width) * 4);
        std::memcpy(sc, sc + ratio * width, size_t(ratio) * size_t(width) * 4);
      }
      ++e;
    }
  }
  return out;
}

}  // namespace dsv4
