// Backend::step_indices on plain arrays: the CPU backend's op and the reference the CUDA kernel
// (cuda/step_indices.cu) is tested against. The kinds are defined in backend.h (StepIndexKind);
// the kernel takes the same description with device pointers.
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace dsv4::cpu {

struct StepIndexArrays {
  StepIndexKind kind = StepIndexKind::NewEntries;
  int64_t rows = 0, spans = 0;
  const int32_t* span_table = nullptr;  // [spans, 3]: row0, n, pos0
  const int32_t* row_span = nullptr;    // [rows]
  const int32_t* positions = nullptr;   // [rows]
  const int32_t* window = nullptr;      // [spans, window_width] pages
  int64_t window_width = 0;
  const int32_t* compressed = nullptr;  // [spans, compressed_width] pages
  int64_t compressed_width = 0;
  const int32_t* scratch = nullptr;     // pages
  const int32_t* topk = nullptr;        // [rows, count]
  int ratio = 0, window_size = 0;
  int64_t count = 0;
};

// The arrays of a Backend::step_indices call (pointers into the tensors' memory).
StepIndexArrays step_index_arrays(const StepIndexArgs& args);

// Elements of the result: rows, rows · (window_size + count) or count, by kind.
int64_t step_indices_size(const StepIndexArrays& a);
// Writes step_indices_size(a) values to out; fails on an inconsistent description.
void step_indices_reference(const StepIndexArrays& a, int32_t* out);

}  // namespace dsv4::cpu
