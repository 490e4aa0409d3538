// Per-layer cache pools and per-sequence cache state (DESIGN §3.2): the 128-slot window ring,
// compressed KV entries (one per 4 or 128 tokens), indexer keys and the compressors' running
// state, all reached through block tables of page ids.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/kv_cache_layout.h"

namespace dsv4 {

// Hands out page ids of one EntryPool, growing the pool (by doubling) when it runs out.
class PagePool {
 public:
  PagePool(Backend& backend, EntryKind kind) : backend_(backend) { pool_.kind = kind; }
  int32_t alloc();
  void free(int32_t page) { free_.push_back(page); }
  EntryPool& pool() { return pool_; }
  const EntryPool& pool() const { return pool_; }
  int64_t pages_in_use() const { return pool_.pages - int64_t(free_.size()); }

 private:
  Backend& backend_;
  EntryPool pool_;
  std::vector<int32_t> free_;
};

inline constexpr int kPageEntries = kv_layout::kEntriesPerPage;

// Global entry id of entry `index` of a block table.
inline int64_t entry_id(const std::vector<int32_t>& pages, int64_t index) {
  return int64_t(pages[size_t(index / kPageEntries)]) * kPageEntries + index % kPageEntries;
}

// The caches of one layer, shared by all sequences.
struct LayerCaches {
  LayerCaches(Backend& be) : kv(be, EntryKind::KV), keys(be, EntryKind::INDEX_KEY) {}
  PagePool kv;    // window rings, compressed entries and a step's new entries
  PagePool keys;  // indexer keys (CSA layers)
};

// One sequence's state in one layer.
struct LayerState {
  std::vector<int32_t> window_pages;  // ring slot s = position mod window
  std::vector<int32_t> comp_pages;    // compressed entry j
  std::vector<int32_t> key_pages;     // indexer key j
  int64_t n_comp = 0, n_keys = 0;
  CompressorState compressor, index_compressor;
};

}  // namespace dsv4
