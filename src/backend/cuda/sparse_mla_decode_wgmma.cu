// Sparse-MLA decode on sm_90a (SPEC §3.6): the same work units, numerics and partials as the
// mma.sync kernel (sparse_mla_decode.cu), for 64 heads × 64-entry blocks, with the phases of a block
// overlapped by warp specialisation and the products on wgmma.
//
// One CTA per SM, four warpgroups:
//   2 and 3 (producers, thread t: entry t / 4 of a block, a quarter of its 16-byte pieces): entry
//     ids and scale codes come through small shared rings (cp.async, ahead of use), the raw entries
//     through a 4-slot cp.async ring per thread, with the lines of the blocks ahead prefetched into
//     L2; each thread dequantises FP8 → bf16 into the free K buffer, and the block's buffer is marked
//     full (mbarrier). At the start of each piece they also copy the job's q.
//   0 (softmax): S = Q · Kᵀ (m64n64k16, 32 steps), mask, scale, online softmax in f32 with the
//     block's row maxima (each row's 64 scores sit in one quad), P rounded to bf16, which it keeps in
//     registers for its own O[:, 0:256] += P · V (register-A wgmma) and stores for warpgroup 1.
//   1: O[:, 256:512] += P · V from the stored P, after rescaling by the block's factors.
// The K tile serves as V without a copy: stored [64-dim chunk][entry][128 B] with the 128-byte
// swizzle, it is K-major for Q · Kᵀ and MN-major (dims contiguous) for P · V.
// Two K buffers: the producers fill one while the consumers use the other, and warpgroup 1's P · V
// of a block overlaps warpgroup 0's Q · Kᵀ of the next. What limits it on the H200 is the
// producers' dequantisation (issue and memory latency with 8 warps), not the tensor cores
// (docs/perf/sparse_mla_indexer.md, series 5).
#include <cuda_bf16.h>

#include <cmath>
#include <type_traits>

#include "backend/cuda/ptx_primitives.cuh"
#include "backend/cuda/sparse_mla_kernels.cuh"
#include "backend/kv_cache_layout.h"

namespace dsv4::cuda::sparse_mla_detail {
namespace {

namespace kl = dsv4::kv_layout;
enum : int { kHeads = 64, kBlock = 64, kD = kl::kHeadDim };  // (enumerators: unused on sm_120a)
// Warpgroups 0 (softmax) and 1 (second half of O), then two producer warpgroups.
constexpr int kProducerBase = 256, kProducers = 256, kThreads = kProducerBase + kProducers;
// Registers: 128 per thread at launch (65536 / 512); setmaxnreg moves what the producers give up to
// the consumers: warpgroup 0 holds S, P and half of O, warpgroup 1 the other half.
constexpr int kLaunchRegs = 128, kProducerRegs = 72, kPvRegs = 160, kSoftmaxRegs = 208;
static_assert((kSoftmaxRegs - kLaunchRegs) + (kPvRegs - kLaunchRegs) <= 2 * (kLaunchRegs - kProducerRegs),
              "register pool");
// Shared memory (from a 1024-byte aligned base): q and the two K buffers as [8 chunks of 64 dims]
// [64 rows][128 B], 16-byte piece i of row r at piece i ^ (r % 8); P as [64 heads][128 B], same swizzle.
constexpr int kChunkBytes = 64 * 128;
constexpr int kTileBytes = 8 * kChunkBytes;  // 64 rows × 512 bf16
enum : int { kQ = 0 };
constexpr int kKv = kTileBytes, kP = kKv + 2 * kTileBytes;
constexpr int kAlpha = kP + kHeads * 128;  // [64] f32: this block's rescale factors
constexpr int kRowMax = kAlpha + 256, kRowSum = kRowMax + 256;  // [64] f32 each, at the end of a piece
constexpr int kValid = kRowSum + 256;    // [2 buffers][8 producer warps] u32
constexpr int kIds = kValid + 64;        // [4 blocks][256 producer threads] i32: entry-id ring
constexpr int kCodes = kIds + 4 * 1024;  // [2 blocks][256 producer threads] 8 bytes: scale-code ring
constexpr int kRing = 4;                 // raw pieces in flight per producer thread
constexpr int kRaw = kCodes + 2 * 2048;  // [kRing][256 producer threads] 16 bytes: raw piece ring
constexpr int kBars = kRaw + kRing * kProducers * 16;  // mbarriers
enum : int { kKvFull = 0, kKvEmpty = 2, kQFull = 4, kQEmpty = 5, kNumBars = 6 };
constexpr int kSmemBytes = kBars + 8 * kNumBars + 1024;  // + slack for the alignment
// Named barriers (0 is __syncthreads'): P stored, P consumed, the piece's row maxima and sums stored.
enum : int { kBarPFull = 1, kBarPFree = 2, kBarRowStats = 3 };

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// wgmma descriptors, 128-byte swizzle. K-major (Q, K, P): 8-row groups 1024 B apart. MN-major (V):
// 64-dim groups kChunkBytes apart (leading), 8-entry groups 1024 B apart (stride).
__device__ __forceinline__ uint64_t desc_k_major(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(kChunkBytes >> 4) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}
// S (+)= Q · Kᵀ for one 16-dim step: m64n64k16, both operands K-major from shared memory.
__device__ __forceinline__ void wgmma_qk(float (&d)[32], uint64_t desc_q, uint64_t desc_k, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_q), "l"(desc_k), "r"(accumulate));
}
// O[:, 128 columns] += P · V for one 16-entry step: m64n128k16 on accumulators d[kOff, kOff + 64), P
// from this thread's registers (the A fragment), V MN-major from shared memory (the K tile read
// transposed). (m64n256 would need 158 registers per thread at launch.)
template <int kOff>
__device__ __forceinline__ void wgmma_pv_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_v) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[kOff + 0]), "+f"(d[kOff + 1]), "+f"(d[kOff + 2]), "+f"(d[kOff + 3]), "+f"(d[kOff + 4]), "+f"(d[kOff + 5]), "+f"(d[kOff + 6]), "+f"(d[kOff + 7]), "+f"(d[kOff + 8]), "+f"(d[kOff + 9]), "+f"(d[kOff + 10]), "+f"(d[kOff + 11]), "+f"(d[kOff + 12]), "+f"(d[kOff + 13]), "+f"(d[kOff + 14]), "+f"(d[kOff + 15]), "+f"(d[kOff + 16]), "+f"(d[kOff + 17]), "+f"(d[kOff + 18]), "+f"(d[kOff + 19]), "+f"(d[kOff + 20]), "+f"(d[kOff + 21]), "+f"(d[kOff + 22]), "+f"(d[kOff + 23]), "+f"(d[kOff + 24]), "+f"(d[kOff + 25]), "+f"(d[kOff + 26]), "+f"(d[kOff + 27]), "+f"(d[kOff + 28]), "+f"(d[kOff + 29]), "+f"(d[kOff + 30]), "+f"(d[kOff + 31]), "+f"(d[kOff + 32]), "+f"(d[kOff + 33]), "+f"(d[kOff + 34]), "+f"(d[kOff + 35]), "+f"(d[kOff + 36]), "+f"(d[kOff + 37]), "+f"(d[kOff + 38]), "+f"(d[kOff + 39]), "+f"(d[kOff + 40]), "+f"(d[kOff + 41]), "+f"(d[kOff + 42]), "+f"(d[kOff + 43]), "+f"(d[kOff + 44]), "+f"(d[kOff + 45]), "+f"(d[kOff + 46]), "+f"(d[kOff + 47]), "+f"(d[kOff + 48]), "+f"(d[kOff + 49]), "+f"(d[kOff + 50]), "+f"(d[kOff + 51]), "+f"(d[kOff + 52]), "+f"(d[kOff + 53]), "+f"(d[kOff + 54]), "+f"(d[kOff + 55]), "+f"(d[kOff + 56]), "+f"(d[kOff + 57]), "+f"(d[kOff + 58]), "+f"(d[kOff + 59]), "+f"(d[kOff + 60]), "+f"(d[kOff + 61]), "+f"(d[kOff + 62]), "+f"(d[kOff + 63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_v), "r"(1));
}
// The same with P K-major from shared memory.
template <int kOff>
__device__ __forceinline__ void wgmma_pv_ss(float (&d)[128], uint64_t desc_p, uint64_t desc_v) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[kOff + 0]), "+f"(d[kOff + 1]), "+f"(d[kOff + 2]), "+f"(d[kOff + 3]), "+f"(d[kOff + 4]), "+f"(d[kOff + 5]), "+f"(d[kOff + 6]), "+f"(d[kOff + 7]), "+f"(d[kOff + 8]), "+f"(d[kOff + 9]), "+f"(d[kOff + 10]), "+f"(d[kOff + 11]), "+f"(d[kOff + 12]), "+f"(d[kOff + 13]), "+f"(d[kOff + 14]), "+f"(d[kOff + 15]), "+f"(d[kOff + 16]), "+f"(d[kOff + 17]), "+f"(d[kOff + 18]), "+f"(d[kOff + 19]), "+f"(d[kOff + 20]), "+f"(d[kOff + 21]), "+f"(d[kOff + 22]), "+f"(d[kOff + 23]), "+f"(d[kOff + 24]), "+f"(d[kOff + 25]), "+f"(d[kOff + 26]), "+f"(d[kOff + 27]), "+f"(d[kOff + 28]), "+f"(d[kOff + 29]), "+f"(d[kOff + 30]), "+f"(d[kOff + 31]), "+f"(d[kOff + 32]), "+f"(d[kOff + 33]), "+f"(d[kOff + 34]), "+f"(d[kOff + 35]), "+f"(d[kOff + 36]), "+f"(d[kOff + 37]), "+f"(d[kOff + 38]), "+f"(d[kOff + 39]), "+f"(d[kOff + 40]), "+f"(d[kOff + 41]), "+f"(d[kOff + 42]), "+f"(d[kOff + 43]), "+f"(d[kOff + 44]), "+f"(d[kOff + 45]), "+f"(d[kOff + 46]), "+f"(d[kOff + 47]), "+f"(d[kOff + 48]), "+f"(d[kOff + 49]), "+f"(d[kOff + 50]), "+f"(d[kOff + 51]), "+f"(d[kOff + 52]), "+f"(d[kOff + 53]), "+f"(d[kOff + 54]), "+f"(d[kOff + 55]), "+f"(d[kOff + 56]), "+f"(d[kOff + 57]), "+f"(d[kOff + 58]), "+f"(d[kOff + 59]), "+f"(d[kOff + 60]), "+f"(d[kOff + 61]), "+f"(d[kOff + 62]), "+f"(d[kOff + 63])
      : "l"(desc_p), "l"(desc_v), "r"(1));
}
__device__ __forceinline__ void bar_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_f32(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}

// Where one accumulator half (dims [dim0, dim0 + 256)) of a piece goes: the output (whole job: with
// the sink, 1 / (l + exp(sink − m))) or the f32 partial for the combine. Accumulator i of this thread:
// row r0 + 8·((i / 2) & 1), dim dim0 + 8·(i / 4) + 2q + (i & 1).
__device__ __forceinline__ void store_half(const KernelParams& p, const float (&o)[128], int dim0, int query,
                                           int slot, int r0, int q, const float (&m)[2], const float (&l)[2],
                                           const float (&sink)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = r0 + 8 * h;
    if (slot < 0) {
      const float mu = m[h] == -INFINITY ? 0.f : m[h];
      const float inv = 1.f / (l[h] + __expf(sink[h] - mu));
      __nv_bfloat16* dst = p.a.out + (size_t(query) * kHeads + row) * kD + dim0 + 2 * q;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<uint32_t*>(dst + 8 * j) = pack_bf16(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
    } else {
      float* dst = p.plan.partial_acc + (size_t(slot) * kHeads + row) * kD + dim0 + 2 * q;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[4 * j + 2 * h], o[4 * j + 2 * h + 1]);
    }
  }
}
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void producer_role(const KernelParams& p, uint32_t smem) {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
  const int tid = threadIdx.x;
  auto bar = [&](int i) { return smem + kBars + 8 * i; };
  const SparseMlaArgs& a = p.a;
  // Plain C++ stores for the tile (ordered by the barriers' memory clobbers): volatile ones would pin
  // the order and make the compiler hold every piece's conversion at once.
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const tile_base = smem_raw + (smem - smem_u32(smem_raw));
  auto sts = [&](uint32_t addr, const uint4& v) { *reinterpret_cast<uint4*>(tile_base + (addr - smem)) = v; };
  // Thread t (two warpgroups): entry e = t / 4 of each block, 16-byte pieces 4i + quarter (i = 0..8) of
  // its 36 (28 e4m3 pieces of 16 dims, then 8 bf16 rope pieces of 8 dims). Piece 4i + quarter of an
  // e4m3 row is scale group i, chunks 2·quarter and + 1 of the group's 64 dims; so a quarter-warp's
  // (2 entries × 4 quarters) tile stores fall in 8 distinct bank groups, and an entry's 4 threads
  // read 64 contiguous bytes per load.
  const int t = tid - kProducerBase, e = t / 4, quarter = t % 4;
  const uint32_t row_off = e * 128, sw = (e & 7) ^ (2 * quarter), sw_rope = (e & 7) ^ quarter;
  int it = 0, piece_no = 0;
  for_each_piece(p, [&](int job, int begin, int end, int, bool last_piece) {
    const int query = job;  // 64 heads: one head group
    const int len = a.list_lengths ? min(a.list_lengths[query], a.list_stride) : a.list_stride;
    const int32_t* list = a.lists + size_t(query) * a.list_stride;
    // Entry ids and scale codes go through small shared rings filled by cp.async (each thread copies
    // and reads its own), ids three blocks ahead and codes one: a value loaded into a register and
    // carried to the next block would be waited for where the compiler rotates the registers.
    // The ids are copied without waiting for the list length (inside the list's row, the length
    // load overlaps the copies) and masked by it when read.
    auto id_valid = [&](int block) { return block < end && block * kBlock + e < len; };
    auto issue_id = [&](int block) {
      if (block < end && block * kBlock + e < a.list_stride)
        cp_async4(smem + kIds + (block % 4) * 1024 + t * 4, list + block * kBlock + e);
    };
    auto entry_id = [&](int block) -> int32_t {
      return id_valid(block) ? int32_t(ld_shared_u32(smem + kIds + (block % 4) * 1024 + t * 4)) : -1;
    };
    auto entry_src = [&](int block, int32_t g) -> const uint8_t* {
      const int pos = block * kBlock + e;
      return g >= 0 ? (pos < a.window_len ? a.window_pool : a.compressed_pool) + kl::kv_entry_data_offset(g) : nullptr;
    };
    auto issue_codes = [&](const uint8_t* src, int32_t g, int slot) {
      if (src) cp_async8(smem + kCodes + slot * 2048 + t * 8, src + kl::kv_scale_from_data_delta(g));
    };
    // L2 prefetch of an entry's 5 lines (576 bytes from a 64-byte boundary: x + 128k, k = 0..4, touch
    // each) and of its scale bytes, spread over the entry's 4 threads.
    auto prefetch_entry = [&](const uint8_t* src, int32_t g) {
      if (!src) return;
      prefetch_l2(src + 128 * quarter);
      if (quarter == 0) prefetch_l2(src + 512);
      if (quarter == 1) prefetch_l2(src + kl::kv_scale_from_data_delta(g));
    };
    // Entries are prefetched into L2 one to two blocks ahead; the next job's q two blocks before the
    // end (this thread's 2 lines of it).
    issue_id(begin);
    issue_id(begin + 1);
    issue_id(begin + 2);
    cp_async_commit();
    // The job's q, once the softmax warpgroup is done with the previous piece's.
    if (piece_no > 0) mbar_wait(bar(kQEmpty), (piece_no - 1) & 1);
    {
      const __nv_bfloat16* q_src = a.q + size_t(query) * kHeads * kD;
#pragma unroll 4
      for (int i = t; i < kHeads * (kD / 8); i += kProducers) {
        const int row = i / (kD / 8), j = i % (kD / 8);
        cp_async16(smem + kQ + (j / 8) * kChunkBytes + row * 128 + (((j % 8) ^ (row & 7)) << 4), q_src + size_t(i) * 8);
      }
      cp_async_commit();
    }
    // The raw pieces stream through a private ring of kRing 16-byte slots per thread in shared memory
    // (cp.async, no registers held): piece n of the job's blocks (block n / 9, piece n % 9) is
    // converted while pieces n + 1 … n + kRing − 1 are in flight, and its slot is refilled with
    // piece n + kRing, of the next block when needed. One cp.async group per piece (ids, codes and q
    // ride in the group of the piece issued after them), so cp.async.wait_group kRing − 1 means
    // "piece n has landed".
    auto issue_piece = [&](const uint8_t* piece_src, int i, int n) {
      const uint32_t dst = smem + kRaw + ((n % kRing) * kProducers + t) * 16;
      if (piece_src)
        cp_async16(dst, piece_src + 64 * i + 16 * quarter);
      else
        cp_async16(dst, list, 0);  // zero-filled
      cp_async_commit();
    };
    cp_async_wait<1>();  // the first ids (q may still be in flight)
    const int32_t id_first = entry_id(begin);
    const uint8_t* src = entry_src(begin, id_first);
    issue_codes(src, id_first, it & 1);
#pragma unroll
    for (int n = 0; n < kRing; ++n) issue_piece(src, n, n);
    // The ring holds the first 4 of the thread's 9 pieces (the entry's first 256 bytes); the lines of
    // the other 5 go to L2 now, so that a piece's start costs one memory latency, not three.
    if (src && quarter < 3) prefetch_l2(src + 256 + 128 * quarter);
    cp_async_wait<kRing>();  // q (the pieces may still be in flight)
    fence_proxy_async();     // q is read by the tensor cores
    mbar_arrive(bar(kQFull));
    ++piece_no;
    int n0 = 0;  // the job's pieces before this block
    for (int block = begin; block < end; ++block, ++it, n0 += 9) {
      const int32_t id_next = entry_id(block + 1), id_after = entry_id(block + 2);
      const uint8_t* const src_next = entry_src(block + 1, id_next);
      if (block == begin) prefetch_entry(src_next, id_next);
      issue_codes(src_next, id_next, (it + 1) & 1);
      issue_id(block + 3);  // (both ride in the next piece's group)
      prefetch_entry(entry_src(block + 2, id_after), id_after);
      if (!last_piece && block == max(begin, end - 2)) {
        const uint8_t* q_next = reinterpret_cast<const uint8_t*>(a.q + size_t(query + 1) * kHeads * kD) + t * 128;
        prefetch_l2(q_next);
        prefetch_l2(q_next + kProducers * 128);
      }
      const int buf = it & 1;
      if (it >= 2) mbar_wait(bar(kKvEmpty + buf), ((it >> 1) - 1) & 1);
      const uint32_t kv = smem + kKv + buf * kTileBytes + row_off;
      cp_async_wait<kRing - 1>();  // this block's codes and first piece
      uint2 codes = make_uint2(0, 0);
      if (src) {
        const uint32_t at = smem + kCodes + (it & 1) * 2048 + t * 8;
        codes = make_uint2(ld_shared_u32(at), ld_shared_u32(at + 4));
      }
      // The scale codes decide the conversion once per entry, so that the pieces' conversions have no
      // branch between them.
      bool fast = true;  // (a missing entry converts zeros: any code will do)
#pragma unroll
      for (int k = 0; k < kl::kNumScales; ++k)
        fast = fast && fast_scale_code((k < 4 ? codes.x >> (8 * k) : codes.y >> (8 * (k - 4))) & 0xffu);
      fast = fast || !src;
      auto convert = [&](int i, const uint4& v) {
        if (i < kl::kNopeDim / 64) {
          const uint32_t code = (i < 4 ? codes.x >> (8 * i) : codes.y >> (8 * (i - 4))) & 0xffu;
          uint4 lo, hi;
          if (fast)
            dequant16_fast(v, code, lo, hi);
          else
            dequant16_f32(v, code, lo, hi);
          const uint32_t chunk = kv + i * kChunkBytes;
          sts(chunk + (sw << 4), lo);
          sts(chunk + ((1 ^ sw) << 4), hi);
        } else {  // rope pieces 28 + 4(i − 7) + quarter: chunk 4(i − 7) + quarter of the last group
          sts(kv + 7 * kChunkBytes + (((4 * (i - 7)) ^ sw_rope) << 4), v);
        }
      };
#pragma unroll
      for (int i = 0; i < 9; ++i) {
        const int n = n0 + i;
        if (i > 0) cp_async_wait<kRing - 1>();
        const uint4 v = ld_shared_v4(smem + kRaw + ((n % kRing) * kProducers + t) * 16);
        convert(i, v);
        // Refill the slot: piece i + kRing of this block, or of the next (none past the job's end).
        if (i + kRing < 9)
          issue_piece(src, i + kRing, n + kRing);
        else
          issue_piece(block + 1 < end ? src_next : nullptr, i + kRing - 9, n + kRing);
      }
      // Valid entries as one ballot word per producer warp (bit 4·(e % 8) for entry e).
      const uint32_t valid = __ballot_sync(0xffffffffu, src != nullptr);
      if (t % 32 == 0) st_shared_u32(smem + kValid + buf * 32 + 4 * (t / 32), valid);
      fence_proxy_async();  // the tile is read by the tensor cores
      mbar_arrive(bar(kKvFull + buf));
      src = src_next;
    }
  });
}

__device__ __forceinline__ void softmax_role(const KernelParams& p, uint32_t smem) {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kSoftmaxRegs));
  const int tid = threadIdx.x, lane = tid % 32;
  auto bar = [&](int i) { return smem + kBars + 8 * i; };
  const SparseMlaArgs& a = p.a;
  const int w = (tid % 128) / 32, q = lane % 4;
  const int r0 = 16 * w + lane / 4;  // this thread's rows (heads) r0 and r0 + 8
  const float sink[2] = {p.a.sink[r0], p.a.sink[r0 + 8]};  // (64 heads: one head group)
  int it = 0;
  // ---- Softmax warpgroup: S, P, O[:, 0:256].
  int piece_no = 0;
  for_each_piece(p, [&](int job, int begin, int end, int slot, bool last_piece) {
    const int query = job;  // 64 heads: one head group
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    mbar_wait(bar(kQFull), piece_no & 1);
    for (int block = begin; block < end; ++block, ++it) {
      const int buf = it & 1;
      const uint32_t kv = smem + kKv + buf * kTileBytes;
      mbar_wait(bar(kKvFull + buf), (it >> 1) & 1);
      float s[32];
      wgmma_fence();
      // Descriptors built once; step ks adds its byte offset / 16 to the address field: chunk ks / 4,
      // 32 bytes further along the rows per step inside it.
      const uint64_t desc_q = desc_k_major(smem + kQ), desc_k = desc_k_major(kv);
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks) {
        const uint32_t off = ((ks / 4) * kChunkBytes + (ks % 4) * 32) >> 4;
        wgmma_qk(s, desc_q + off, desc_k + off, ks > 0);
      }
      wgmma_commit();
      wgmma_wait_all();
      fence_operands(s);
      if (block == end - 1) mbar_arrive(bar(kQEmpty));  // this piece's q is no longer read
      // Mask, row maxima: accumulator i is row r0 + 8·((i / 2) & 1), entry 8·(i / 4) + 2q + (i & 1).
      // Entry e is valid when bit 4·(e % 8) of word e / 8 is set (the producer warps' ballots);
      // blocks without a missing entry skip the test.
      const uint4 valid_lo = ld_shared_v4(smem + kValid + buf * 32), valid_hi = ld_shared_v4(smem + kValid + buf * 32 + 16);
      const uint32_t words[8] = {valid_lo.x, valid_lo.y, valid_lo.z, valid_lo.w, valid_hi.x, valid_hi.y, valid_hi.z, valid_hi.w};
      if ((words[0] & words[1] & words[2] & words[3] & words[4] & words[5] & words[6] & words[7] & 0x11111111u) !=
          0x11111111u) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const bool v = (words[j] >> (4 * (2 * q + c))) & 1u;
            s[4 * j + c] = v ? s[4 * j + c] : -INFINITY;
            s[4 * j + 2 + c] = v ? s[4 * j + 2 + c] : -INFINITY;
          }
      }
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        mx[0] = fmaxf(mx[0], fmaxf(s[4 * j], s[4 * j + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
      }
      // max(s) · scale is the maximum of the scaled scores (scale > 0). p = exp(s · scale − m) as the
      // mma.sync kernel computes it: the rounded product first, so that the maximum gives exp(0).
      float alpha[2], m_use[2], psum[2] = {0.f, 0.f};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float m_new = fmaxf(m[h], __fmul_rn(mx[h], a.scale));
        m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // nothing valid yet: keep the state empty
        alpha[h] = __expf(m[h] - m_use[h]);
        m[h] = m_new;
      }
      // p in f32 (sum in f32), rounded to bf16 for P·V (SPEC §3.11.6); pa[4k..4k+3] is the A
      // fragment of 16-entry step k.
      uint32_t pa[16];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        // (__fmul_rn: a product contracted into the subtraction would not cancel exactly at the maximum.)
        const float p0 = __expf(__fmul_rn(s[4 * j], a.scale) - m_use[0]);
        const float p1 = __expf(__fmul_rn(s[4 * j + 1], a.scale) - m_use[0]);
        const float p2 = __expf(__fmul_rn(s[4 * j + 2], a.scale) - m_use[1]);
        const float p3 = __expf(__fmul_rn(s[4 * j + 3], a.scale) - m_use[1]);
        psum[0] += p0 + p1;
        psum[1] += p2 + p3;
        pa[2 * (j / 2) * 2 + (j % 2) * 2] = pack_bf16(p0, p1);
        pa[2 * (j / 2) * 2 + (j % 2) * 2 + 1] = pack_bf16(p2, p3);
      }
      l[0] = l[0] * alpha[0] + psum[0];
      l[1] = l[1] * alpha[1] + psum[1];
      // Once the running maxima settle every alpha is exactly 1 (exp(0)); skipping is then exact.
      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
      }
      // P and the factors for warpgroup 1, once it is done with the previous block's.
      if (it > 0) bar_sync(kBarPFree);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t col = 16 * j + 4 * q;  // byte of entry 8j + 2q in the row
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = r0 + 8 * h;
          st_shared_u32(smem + kP + row * 128 + ((((col >> 4) ^ (row & 7))) << 4) + (col & 15),
                        pa[2 * (j / 2) * 2 + (j % 2) * 2 + h]);
        }
      }
      if (q == 0) {
        st_shared_f32(smem + kAlpha + r0 * 4, alpha[0]);
        st_shared_f32(smem + kAlpha + (r0 + 8) * 4, alpha[1]);
      }
      fence_proxy_async();  // P is read by warpgroup 1's tensor cores
      bar_arrive(kBarPFull);
      fence_operands(o);
      wgmma_fence();
      const uint64_t desc_v = desc_mn_major(kv);
#pragma unroll
      for (int k = 0; k < kBlock / 16; ++k) {
        const uint32_t a_frag[4] = {pa[4 * k], pa[4 * k + 1], pa[4 * k + 2], pa[4 * k + 3]};
        wgmma_pv_rs<0>(o, a_frag, desc_v + ((k * 16 * 128) >> 4));
        wgmma_pv_rs<64>(o, a_frag, desc_v + ((k * 16 * 128 + 2 * kChunkBytes) >> 4));
      }
      wgmma_commit();
      wgmma_wait_all();
      fence_operands(o);
      mbar_arrive(bar(kKvEmpty + buf));
    }
    ++piece_no;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    if (q == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        st_shared_f32(smem + kRowMax + (r0 + 8 * h) * 4, m[h]);
        st_shared_f32(smem + kRowSum + (r0 + 8 * h) * 4, l[h]);
        if (slot >= 0) p.plan.partial_ml[size_t(slot) * kHeads + r0 + 8 * h] = make_float2(m[h], l[h]);
      }
    }
    bar_arrive(kBarRowStats);
    store_half(p, o, 0, query, slot, r0, q, m, l, sink);
    (void)last_piece;
  });
}

__device__ __forceinline__ void pv_role(const KernelParams& p, uint32_t smem) {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kPvRegs));
  const int tid = threadIdx.x, lane = tid % 32;
  auto bar = [&](int i) { return smem + kBars + 8 * i; };
  const int w = (tid % 128) / 32, q = lane % 4;
  const int r0 = 16 * w + lane / 4;  // this thread's rows (heads) r0 and r0 + 8
  const float sink[2] = {p.a.sink[r0], p.a.sink[r0 + 8]};  // (64 heads: one head group)
  int it = 0;
  // ---- Warpgroup 1: O[:, 256:512] from the stored P.
  for_each_piece(p, [&](int job, int begin, int end, int slot, bool last_piece) {
    const int query = job;  // 64 heads: one head group
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    for (int block = begin; block < end; ++block, ++it) {
      const int buf = it & 1;
      const uint32_t kv = smem + kKv + buf * kTileBytes;
      mbar_wait(bar(kKvFull + buf), (it >> 1) & 1);
      bar_sync(kBarPFull);
      const float alpha[2] = {ld_shared_f32(smem + kAlpha + r0 * 4), ld_shared_f32(smem + kAlpha + (r0 + 8) * 4)};
      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
      }
      fence_operands(o);
      wgmma_fence();
      const uint64_t desc_p = desc_k_major(smem + kP), desc_v = desc_mn_major(kv + 4 * kChunkBytes);
#pragma unroll
      for (int k = 0; k < kBlock / 16; ++k) {
        wgmma_pv_ss<0>(o, desc_p + ((k * 32) >> 4), desc_v + ((k * 16 * 128) >> 4));
        wgmma_pv_ss<64>(o, desc_p + ((k * 32) >> 4), desc_v + ((k * 16 * 128 + 2 * kChunkBytes) >> 4));
      }
      wgmma_commit();
      wgmma_wait_all();
      fence_operands(o);
      if (!(last_piece && block == end - 1)) bar_arrive(kBarPFree);
      mbar_arrive(bar(kKvEmpty + buf));
    }
    bar_sync(kBarRowStats);
    const float m[2] = {ld_shared_f32(smem + kRowMax + r0 * 4), ld_shared_f32(smem + kRowMax + (r0 + 8) * 4)};
    const float l[2] = {ld_shared_f32(smem + kRowSum + r0 * 4), ld_shared_f32(smem + kRowSum + (r0 + 8) * 4)};
    store_half(p, o, 256, query, slot, r0, q, m, l, sink);
  });
}

#endif

__global__ void __launch_bounds__(kThreads, 1) sparse_mla_wgmma_kernel(const KernelParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem = (smem_u32(smem_raw) + 1023) & ~1023u;
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) {
      mbar_init(smem + kBars + 8 * (kKvFull + b), kProducers);
      mbar_init(smem + kBars + 8 * (kKvEmpty + b), 256);
    }
    mbar_init(smem + kBars + 8 * kQFull, kProducers);
    mbar_init(smem + kBars + 8 * kQEmpty, 128);
    fence_mbar_init();
  }
  pdl_wait();  // q, lists and the plan come from earlier kernels
  pdl_launch_dependents();  // the combine kernel may take idle SMs now; it waits for this grid
  __syncthreads();
  // Each role starts with its setmaxnreg, so no value computed before the split stays live in it.
  const int wg = threadIdx.x / 128;
  if (wg >= 2)
    producer_role(p, smem);
  else if (wg == 0)
    softmax_role(p, smem);
  else
    pv_role(p, smem);
#endif
}

}  // namespace

bool sparse_mla_wgmma_supported() {
  static const bool supported = runs_sm90a_code(sparse_mla_wgmma_kernel);
  return supported;
}

void sparse_mla_wgmma_launch(int grid, const KernelParams& kp, cudaStream_t stream) {
  allow_dynamic_smem(sparse_mla_wgmma_kernel, kSmemBytes);
  launch_programmatic(sparse_mla_wgmma_kernel, dim3(grid), dim3(kThreads), kSmemBytes, stream, kp);
}

}  // namespace dsv4::cuda::sparse_mla_detail

namespace dsv4::cuda {

SparseMlaTile sparse_mla_wgmma_tile() {
  namespace d = sparse_mla_detail;
  return SparseMlaTile{true, d::kHeads, d::kBlock, 0, d::kThreads, size_t(d::kSmemBytes)};
}

}  // namespace dsv4::cuda
