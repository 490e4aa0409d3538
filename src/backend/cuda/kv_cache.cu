// Quantise-on-write kernels of the paged caches. The quantisers are the host codecs of
// backend/kv_cache_layout.h written for the device; the GPU test checks them byte for byte.
#include "backend/cuda/kv_cache.h"

#include <cuda_fp8.h>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/ptx_primitives.cuh"
#include "backend/cuda/quant_math.cuh"
#include "backend/kv_cache_layout.h"

namespace dsv4::cuda {
namespace {

namespace kl = dsv4::kv_layout;

__device__ __forceinline__ uint8_t e8m0_of_pow2(float p) {
  const uint32_t u = __float_as_uint(p);
  return u == 0x00400000u ? 0 : uint8_t((u >> 23) & 0xff);
}

// e2m1 round-to-nearest-even on {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at 6 (core/dtypes.h).
__device__ __forceinline__ uint32_t to_e2m1(float v) {
  const uint32_t sign = v < 0.f || (v == 0.f && signbit(v)) ? 8u : 0u;
  const float a = fabsf(v);
  uint32_t code;
  if (a <= 0.25f) code = 0;        // tie at .25 → 0 (even)
  else if (a < 0.75f) code = 1;    // tie at .75 → 1.0 (code 2, even)
  else if (a <= 1.25f) code = 2;   // tie at 1.25 → 1.0 (even)
  else if (a < 1.75f) code = 3;    // tie at 1.75 → 2.0 (even)
  else if (a <= 2.5f) code = 4;    // tie at 2.5 → 2.0 (even)
  else if (a < 3.5f) code = 5;     // tie at 3.5 → 4.0 (even)
  else if (a <= 5.0f) code = 6;    // tie at 5 → 4.0 (even)
  else code = 7;
  return sign | code;
}

// One warp per entry. Lanes 0..27 quantise 16 nope values each (4 lanes per 64-value scale block),
// lanes 28..31 copy 16 rope values each.
__global__ void append_kv_entries_kernel(const __nv_bfloat16* __restrict__ values, const int32_t* __restrict__ ids,
                                         int n, uint8_t* __restrict__ pool) {
  pdl_wait();  // the values (and ids) come from earlier kernels
  pdl_launch_dependents();
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n) return;
  const int32_t g = ids[row];
  if (g < 0) return;
  const __nv_bfloat16* src = values + size_t(row) * kl::kHeadDim + lane * 16;
  float x[16];
  const uint4 raw0 = reinterpret_cast<const uint4*>(src)[0];
  const uint4 raw1 = reinterpret_cast<const uint4*>(src)[1];
  const uint32_t w[8] = {raw0.x, raw0.y, raw0.z, raw0.w, raw1.x, raw1.y, raw1.z, raw1.w};
  uint8_t* data = pool + kl::kv_entry_data_offset(g);
  if (lane >= 28) {  // rope: raw bf16
    uint4* dst = reinterpret_cast<uint4*>(data + kl::kNopeDim + (lane - 28) * 32);
    dst[0] = raw0;
    dst[1] = raw1;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    x[2 * i] = __uint_as_float(w[i] << 16);
    x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(x[i]));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  if (lane >= 28) return;
  if (!(amax > 1e-4f)) amax = 1e-4f;
  const float s = pow2_ceil_dev(amax * (1.0f / 448.0f));
  uint32_t packed[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    packed[i] = uint32_t(to_e4m3(x[4 * i] / s)) | uint32_t(to_e4m3(x[4 * i + 1] / s)) << 8 |
                uint32_t(to_e4m3(x[4 * i + 2] / s)) << 16 | uint32_t(to_e4m3(x[4 * i + 3] / s)) << 24;
  *reinterpret_cast<uint4*>(data + lane * 16) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  uint8_t* scales = pool + kl::kv_entry_scale_offset(g);
  if (lane % 4 == 0) scales[lane / 4] = e8m0_of_pow2(s);
  if (lane == 0) scales[kl::kNumScales] = 0;
}

// One warp per key: lane holds 4 values; 8 lanes per 32-value FP4 block.
template <bool kFp4>
__global__ void append_index_keys_kernel(const __nv_bfloat16* __restrict__ values, const int32_t* __restrict__ ids,
                                         int n, uint8_t* __restrict__ pool) {
  pdl_wait();  // the values (and ids) come from earlier kernels
  pdl_launch_dependents();
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n) return;
  const int32_t g = ids[row];
  if (g < 0) return;
  const uint2 raw = reinterpret_cast<const uint2*>(values + size_t(row) * kl::kIndexDim)[lane];
  const float x[4] = {__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xffff0000u),
                      __uint_as_float(raw.y << 16), __uint_as_float(raw.y & 0xffff0000u)};
  float amax = fmaxf(fmaxf(fabsf(x[0]), fabsf(x[1])), fmaxf(fabsf(x[2]), fabsf(x[3])));
  if constexpr (kFp4) {
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float floor = 6.0f * __uint_as_float(0x00800000u);
    if (!(amax > floor)) amax = floor;
    const float s = pow2_ceil_dev(amax / 6.0f);
    const uint32_t c = to_e2m1(fminf(fmaxf(x[0] / s, -6.f), 6.f)) | to_e2m1(fminf(fmaxf(x[1] / s, -6.f), 6.f)) << 4 |
                       to_e2m1(fminf(fmaxf(x[2] / s, -6.f), 6.f)) << 8 | to_e2m1(fminf(fmaxf(x[3] / s, -6.f), 6.f)) << 12;
    *reinterpret_cast<uint16_t*>(pool + kl::index_fp4_data_offset(g) + lane * 2) = uint16_t(c);
    if (lane % 8 == 0) pool[kl::index_fp4_scale_offset(g) + lane / 8] = e8m0_of_pow2(s);
  } else {
    for (int o = 1; o < 32; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (!(amax > 1e-4f)) amax = 1e-4f;
    const float s = pow2_ceil_dev(amax * (1.0f / 448.0f));
    const uint32_t c = uint32_t(to_e4m3(x[0] / s)) | uint32_t(to_e4m3(x[1] / s)) << 8 |
                       uint32_t(to_e4m3(x[2] / s)) << 16 | uint32_t(to_e4m3(x[3] / s)) << 24;
    *reinterpret_cast<uint32_t*>(pool + kl::index_fp8_data_offset(g) + lane * 4) = c;
    if (lane == 0) *reinterpret_cast<float*>(pool + kl::index_fp8_scale_offset(g)) = s;
  }
}

constexpr int kWarpsPerBlock = 8;

// One warp per entry: 576 data bytes as 36 × 16 bytes, then the 8 scale bytes.
__global__ void copy_kv_entries_kernel(const int32_t* __restrict__ src_ids, const int32_t* __restrict__ dst_ids, int n,
                                       uint8_t* __restrict__ pool) {
  pdl_wait();  // the ids and the source entries come from earlier kernels
  pdl_launch_dependents();
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n) return;
  const int32_t s = src_ids[row], d = dst_ids[row];
  if (s < 0 || d < 0) return;
  const uint4* src = reinterpret_cast<const uint4*>(pool + kl::kv_entry_data_offset(s));
  uint4* dst = reinterpret_cast<uint4*>(pool + kl::kv_entry_data_offset(d));
  for (int i = lane; i < kl::kEntryDataBytes / 16; i += 32) dst[i] = src[i];
  if (lane == 0)
    *reinterpret_cast<uint2*>(pool + kl::kv_entry_scale_offset(d)) =
        *reinterpret_cast<const uint2*>(pool + kl::kv_entry_scale_offset(s));
}

// One warp per entry: the launch every append below shares.
template <typename Kernel>
void launch_per_entry(Kernel kernel, const __nv_bfloat16* values, const int32_t* entry_ids, int n, uint8_t* pool,
                      cudaStream_t stream) {
  if (n <= 0) return;
  launch_programmatic(kernel, dim3(unsigned((n + kWarpsPerBlock - 1) / kWarpsPerBlock)), dim3(kWarpsPerBlock * 32), 0, stream,
                      values, entry_ids, n, pool);
  DSV4_CUDA_CHECK_LAUNCH();
}

}  // namespace

void append_kv_entries(const __nv_bfloat16* values, const int32_t* entry_ids, int n, uint8_t* pool,
                       cudaStream_t stream) {
  launch_per_entry(append_kv_entries_kernel, values, entry_ids, n, pool, stream);
}

void append_index_keys_fp4(const __nv_bfloat16* values, const int32_t* entry_ids, int n, uint8_t* pool,
                           cudaStream_t stream) {
  launch_per_entry(append_index_keys_kernel<true>, values, entry_ids, n, pool, stream);
}

void append_index_keys_fp8(const __nv_bfloat16* values, const int32_t* entry_ids, int n, uint8_t* pool,
                           cudaStream_t stream) {
  launch_per_entry(append_index_keys_kernel<false>, values, entry_ids, n, pool, stream);
}

void copy_kv_entries(const int32_t* src_ids, const int32_t* dst_ids, int n, uint8_t* pool, cudaStream_t stream) {
  if (n <= 0) return;
  launch_programmatic(copy_kv_entries_kernel, dim3(unsigned((n + kWarpsPerBlock - 1) / kWarpsPerBlock)),
                      dim3(kWarpsPerBlock * 32), 0, stream, src_ids, dst_ids, n, pool);
  DSV4_CUDA_CHECK_LAUNCH();
}

}  // namespace dsv4::cuda
