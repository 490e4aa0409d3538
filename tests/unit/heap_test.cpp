// release_free_heap gives back what a burst of large allocations left in glibc's arenas.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/heap.h"

namespace dsv4 {
namespace {

// The compiler may drop a malloc / free pair whose block nobody else can see: this one escapes.
void* volatile escaped = nullptr;
void* touched_block(size_t bytes) {
  void* p = std::malloc(bytes);
  escaped = p;
  std::memset(escaped, 1, bytes);
  return escaped;
}

TEST(Heap, ResidentSizeIsRead) {
  const int64_t before = resident_memory_bytes();
  ASSERT_GT(before, 0);
  void* block = touched_block(8 << 20);  // resident once written
  EXPECT_GE(resident_memory_bytes(), before + (4 << 20));
  std::free(block);
}

TEST(Heap, FreedLargeBlocksGoBackToTheSystem) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "only glibc's allocator keeps freed large blocks";
#else
  // Freeing a block glibc had mmapped raises its mmap threshold to that size; the same sizes then
  // come from the heap and stay resident after their free: the burst a server goes idle after.
  std::free(touched_block(24 << 20));
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(touched_block(2 << 20));
  for (void* b : blocks) std::free(b);
  const int64_t released = release_free_heap();
  std::printf("released %.1f MiB\n", double(released) / (1 << 20));
  EXPECT_GT(released, int64_t(16) << 20);
  EXPECT_GE(release_free_heap(), 0);  // nothing left to give: no harm
#endif
}

}  // namespace
}  // namespace dsv4
