#include "model/kv_pool.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4 {

int32_t PagePool::alloc() {
  if (!can_alloc(1))
    fail("cache pool full: all {} {} pages in use (the scheduler admitted more than fits)", capacity_,
         pool_.kind == EntryKind::KV ? "KV" : "indexer-key");
  if (free_.empty()) {
    int64_t old = pool_.pages, grown = std::max<int64_t>(8, old * 2);
    if (capacity_ > 0) grown = std::min(grown, capacity_);
    backend_.grow_pool(pool_, grown);
    for (int64_t p = grown - 1; p >= old; --p) free_.push_back(int32_t(p));
  }
  int32_t p = free_.back();
  free_.pop_back();
  return p;
}

void PagePool::set_capacity(int64_t pages) {
  DSV4_CHECK(pages >= 0, "cache capacity must be ≥ 0 pages, got {}", pages);
  DSV4_CHECK(pages == 0 || pages >= pages_in_use(), "cache capacity {} pages is below the {} pages in use", pages,
             pages_in_use());
  capacity_ = pages;
}

int32_t StateSlots::alloc(int ratio, int d) {
  if (!states_.ratio) states_.ratio = ratio, states_.d = d;
  DSV4_CHECK(states_.ratio == ratio && states_.d == d, "compressor state: ratio {} d {} asked of states of ratio {} d {}",
             ratio, d, states_.ratio, states_.d);
  if (free_.empty()) {
    const int64_t old = states_.slots, grown = std::max<int64_t>(4, old * 2);
    backend_.grow_compressor_states(states_, grown);
    for (int64_t s = grown - 1; s >= old; --s) free_.push_back(int32_t(s));
  }
  const int32_t s = free_.back();
  free_.pop_back();
  backend_.compressor_state_init(states_, s);
  return s;
}

LayerPages sequence_layer_pages(int ratio, int window, int64_t positions) {
  auto pages = [](int64_t entries) { return (entries + kPageEntries - 1) / kPageEntries; };
  LayerPages p;
  p.kv = pages(window);
  if (ratio > 0) p.kv += pages(positions / ratio);
  if (ratio == 4) p.keys = pages(positions / 4);
  return p;
}

}  // namespace dsv4
