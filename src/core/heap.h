// Giving the heap's free memory back to the system.
#pragma once
#include <cstdint>

namespace dsv4 {

// Returns free heap pages to the system; the resident bytes given back (0 where the C library
// cannot). A burst of large, short-lived allocations (a prefill's activations, a batch's logits)
// leaves glibc's arenas holding up to 64 MiB each once freed: its mmap threshold rises with every
// large block it frees, so later ones come from the arenas and stay resident after their free. A
// server that has gone idle calls this so that its resident size is what it keeps, not what its
// busiest moment needed.
int64_t release_free_heap();

// Resident set size of this process from /proc/self/statm; -1 where it cannot be read.
int64_t resident_memory_bytes();

}  // namespace dsv4
