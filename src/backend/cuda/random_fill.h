// Random weights made in device memory (backend/random_fill.h): the same bytes as
// random_fill_reference, one thread per element. Enqueues only.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/random_fill.h"

namespace dsv4::cuda {

void random_fill(const RandomFill& fill, void* dst, int64_t n, cudaStream_t stream);

}  // namespace dsv4::cuda
