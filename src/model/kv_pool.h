// Per-layer cache pools and per-sequence cache state (DESIGN §3.2): the 128-slot window ring,
// compressed KV entries (one per 4 or 128 tokens), indexer keys and the compressors' running
// state, all reached through block tables of page ids.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/kv_cache_layout.h"

namespace dsv4 {

// Hands out page ids of one EntryPool, growing the pool (by doubling) when it runs out, up to an
// optional capacity. The scheduler admits work only when its pages are known to fit (see
// sequence_layer_pages), so running past the capacity is a scheduler bug, reported as an Error.
class PagePool {
 public:
  PagePool(Backend& backend, EntryKind kind) : backend_(backend) { pool_.kind = kind; }
  int32_t alloc();
  void free(int32_t page) { free_.push_back(page); }
  EntryPool& pool() { return pool_; }
  const EntryPool& pool() const { return pool_; }
  int64_t pages_in_use() const { return pool_.pages - int64_t(free_.size()); }
  // The most pages this pool may hand out at once; 0 = unbounded (the default).
  void set_capacity(int64_t pages);
  int64_t capacity() const { return capacity_; }
  bool can_alloc(int64_t pages) const { return capacity_ == 0 || pages_in_use() + pages <= capacity_; }

 private:
  Backend& backend_;
  EntryPool pool_;
  std::vector<int32_t> free_;
  int64_t capacity_ = 0;
};

// Hands out slots of one compressor's running state (a slot per sequence, CompressorStates),
// growing the states by doubling; a slot handed out starts fresh (kv 0, score −inf).
class StateSlots {
 public:
  explicit StateSlots(Backend& backend) : backend_(backend) {}
  int32_t alloc(int ratio, int d);
  void free(int32_t slot) { free_.push_back(slot); }
  CompressorStates& states() { return states_; }

 private:
  Backend& backend_;
  CompressorStates states_;
  std::vector<int32_t> free_;
};

inline constexpr int kPageEntries = kv_layout::kEntriesPerPage;

// Global entry id of entry `index` of a block table.
inline int64_t entry_id(const std::vector<int32_t>& pages, int64_t index) {
  return int64_t(pages[size_t(index / kPageEntries)]) * kPageEntries + index % kPageEntries;
}

// The caches of one layer, shared by all sequences.
struct LayerCaches {
  LayerCaches(Backend& be) : kv(be, EntryKind::KV), keys(be, EntryKind::INDEX_KEY), compressor(be), index_compressor(be) {}
  PagePool kv;    // window rings, compressed entries and a step's new entries
  PagePool keys;  // indexer keys (CSA layers)
  StateSlots compressor, index_compressor;  // the KV compressor's and (CSA) the indexer's state
};

// One sequence's state in one layer.
struct LayerState {
  std::vector<int32_t> window_pages;  // ring slot s = position mod window
  std::vector<int32_t> comp_pages;    // compressed entry j
  std::vector<int32_t> key_pages;     // indexer key j
  int64_t n_comp = 0, n_keys = 0;
  int32_t compressor_slot = -1, index_compressor_slot = -1;  // in LayerCaches' StateSlots
};

// Page counts in one layer's two pools.
struct LayerPages {
  int64_t kv = 0, keys = 0;
};

// The pages one sequence holds in a layer of compression `ratio` (0, 4 or 128) once `positions`
// tokens have gone through it: the window ring (fixed, allocated with the sequence), one compressed
// entry per `ratio` positions (an entry completes at position ratio·(j+1) − 1, SPEC §3.4) and, for
// CSA (ratio 4), one indexer key per 4 positions. The single place this arithmetic lives; the
// scheduler reserves from it and tests check it against what the model allocates.
LayerPages sequence_layer_pages(int ratio, int window, int64_t positions);

// Scratch pages a step of `rows` rows takes from every layer's kv pool while that layer runs
// (the step's new entries before the ring update, Dsv4Model::attention); freed within the layer.
inline int64_t step_scratch_pages(int64_t rows) { return (rows + kPageEntries - 1) / kPageEntries; }

}  // namespace dsv4
