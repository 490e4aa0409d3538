// Backend::step_indices on the GPU: the step's entry ids, ring slots and attention lists derived
// from the step descriptor's spans and block tables on the device (the CPU twin, which defines
// every kind, is backend/cpu/step_indices_reference.h). Enqueues only.
#pragma once
#include <cuda_runtime.h>

#include "backend/cpu/step_indices_reference.h"

namespace dsv4::cuda {

// `a` holds device pointers; out: step_indices_size(a) int32 values (device).
void step_indices(const cpu::StepIndexArrays& a, int32_t* out, cudaStream_t stream);

// Up to kMaxStepIndexSets descriptions in one launch: a[k] → out[k] (a layer's entry ids, ring slots
// and lists together: they depend only on the step's tables).
constexpr int kMaxStepIndexSets = 4;
void step_indices(const cpu::StepIndexArrays* a, int32_t* const* out, int count, cudaStream_t stream);

}  // namespace dsv4::cuda
