// The FP4 MoE weight layout of the CUDA kernels (backend/cuda/moe_fp4.h) and its load-time repack
// from the on-disk formats, with the inverse for tests. Host code only: the CPU tests check it
// without a GPU.
//
// Weight layout ("unit" layout, read by the kernels in backend/cuda/moe_fp4*.cu). A matrix [R rows, K inputs] is cut
// into units of 16 rows × 64 inputs (512 bytes of e2m1). Units are stored row-tile major, K-chunk minor,
// so one warp streams a row tile's units as contiguous 512-byte pieces. Inside a unit, lane L = 4g + q
// owns 16 bytes = four 32-bit words, word t being its A fragment of mma.m16n8k16 for K step t. The
// mapping of the MMA's k index to the physical input index is permuted (a reduction index may be, as
// long as the activations use the same mapping): for lane q and K step t the MMA positions 2q, 2q+1,
// 2q+8, 2q+9 hold physical inputs 16q+4t+0..3. So a lane's 16 physical inputs are contiguous (its
// activations load as two 16-byte vectors) and fall into one scale group (one scale per row per unit).
// Word t, nibble i < 4 holds the low element of A register i and nibble i+4 its high element, where A
// registers 0..3 are (row g, inputs +0/+1), (row g+8, +0/+1), (row g, +2/+3), (row g+8, +2/+3).
// Fused gate-up: row tile r holds w1 rows 8r..8r+7 then w3 rows 8r..8r+7, so the thread that owns a
// gate output also owns the matching up output and the SwiGLU runs in registers.
//
// Scales (one byte per row per group; units in the same order as the weights): NVFP4 64 bytes per
// unit, byte (4g+q)·2 + h for row g+8h, group 4·kc+q; MXFP4 32 bytes per unit, byte (2g+q/2)·2 + h,
// group 2·kc+q/2. The byte is re-encoded so that the kernel turns it into a bf16 scale with one
// integer op (see moe_fp4_layout.cpp for the encodings and why they are exact).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cpu/moe_fp4_reference.h"

namespace dsv4 {

constexpr int kMoeUnitRows = 16;
constexpr int kMoeUnitCols = 64;
constexpr int kMoeUnitBytes = kMoeUnitRows * kMoeUnitCols / 2;  // 512
constexpr int moe_unit_scale_bytes(MoeFp4Format f) { return kMoeUnitRows * kMoeUnitCols / moe_fp4_group_size(f); }

// W4A8 weights (MXFP4 only; the sm_90a path, moe_fp4_w4a8.cu). The kernel turns each nibble of the
// unit layout into e4m3 = e2m1 · 2^d, d = (group's ue8m0 code) − (largest code of its row) + 6, by
// looking the nibble up in one of kW4a8Tables 8-entry tables (table i holds e4m3(e2m1 · 2^(i +
// kW4a8MinShift))), and multiplies 2^(largest code − 133) per row back in its epilogue. The e4m3
// values are exact for d ≥ −8, i.e. for every group within 2^14 of its row's largest (real
// checkpoints span a few binades); groups further down are rounded to e4m3 (those below 2^-22 of the
// row's largest flush to zero), and the repack counts them.
constexpr int kW4a8MinShift = -16;
constexpr int kW4a8MaxShift = 6;
constexpr int kW4a8Tables = kW4a8MaxShift - kW4a8MinShift + 1;

// Per (expert, matrix) f32 factor the kernels multiply into the accumulator: the repacked weights are
// the true weights divided by this (an exact power-of-two shift, times weight_scale_2 for NVFP4).
enum MoeFactor : int { kGateFactor = 0, kUpFactor = 1, kDownFactor = 2, kFactorsPerExpert = 3 };

// One layer's routed experts in the unit layout, on the host (what the load-time repack produces).
struct MoeFp4Repacked {
  MoeFp4Shape shape;
  std::vector<uint8_t> gate_up;         // E × [2I/16 × D/64 units × 512 B]
  std::vector<uint8_t> gate_up_scales;  // E × [units × scale bytes]
  std::vector<uint8_t> down;            // E × [D/16 × I/64 units × 512 B]
  std::vector<uint8_t> down_scales;
  std::vector<float> factors;           // E × kFactorsPerExpert
  // W4A8 (MXFP4 only, empty for NVFP4): one table index byte per (row, 32 inputs), laid out like the
  // unit scales; and the per-row factors: gate-up [E, I, 2] (gate, up of each channel), down [E, D].
  std::vector<uint8_t> w4a8_gate_up_index, w4a8_down_index;
  std::vector<float> w4a8_gate_up_row_scale, w4a8_down_row_scale;
  size_t w4a8_rounded_groups = 0;  // groups whose e4m3 form is not exact (see kW4a8MinShift)
};

// Load-time repack of every expert's on-disk tensors (validates shapes and scale codes).
MoeFp4Repacked moe_fp4_repack(const MoeFp4Shape& shape, const std::vector<MoeFp4ExpertTensors>& experts);

// Un-does the repack for tests: the f32 weights [w1 | w3 | w2] of expert e that the kernels compute
// with (repacked value × factor), each row-major: w1 [I, D], w3 [I, D], w2 [D, I].
struct MoeFp4ExpertF32 {
  std::vector<float> w1, w3, w2;
};
MoeFp4ExpertF32 moe_fp4_unrepack(const MoeFp4Repacked& repacked, int expert);
// The same for the W4A8 form (MXFP4): e4m3 table value · row factor, as the W4A8 kernel computes.
MoeFp4ExpertF32 moe_fp4_unrepack_w4a8(const MoeFp4Repacked& repacked, int expert);
// e4m3 code of table i's entry for e2m1 magnitude code c (0..7), as the W4A8 kernel builds it.
uint8_t moe_w4a8_table_entry(int table, int code);

}  // namespace dsv4
