#include "runtime/kv_pool.h"

namespace dsv4 {

int32_t PagePool::alloc() {
  if (free_.empty()) {
    int64_t old = pool_.pages, grown = std::max<int64_t>(8, old * 2);
    backend_.grow_pool(pool_, grown);
    for (int64_t p = grown - 1; p >= old; --p) free_.push_back(int32_t(p));
  }
  int32_t p = free_.back();
  free_.pop_back();
  return p;
}

}  // namespace dsv4
