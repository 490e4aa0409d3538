#include "core/heap.h"

#include <cstdio>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace dsv4 {

int64_t resident_memory_bytes() {
  // /proc/self/statm: sizes in pages; the second is the resident set.
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * int64_t(sysconf(_SC_PAGESIZE)) : -1;
}

int64_t release_free_heap() {
#if defined(__GLIBC__)
  const int64_t before = resident_memory_bytes();
  malloc_trim(0);  // every arena, free pages in the middle of a heap too (madvise), not only its top
  const int64_t after = resident_memory_bytes();
  return before >= 0 && after >= 0 && before > after ? before - after : 0;
#else
  return 0;
#endif
}

}  // namespace dsv4
