// Device-side scheduling for the sparse-MLA decode kernel (one small kernel, FlashMLA-style, whose
// output every layer with the same list lengths reuses) and the builder of the per-query entry lists.
#include <algorithm>
#include <string>

#include "backend/cuda/ptx_primitives.cuh"
#include "backend/cuda/sparse_mla_decode.h"
#include "backend/cuda/sparse_mla_kernels.cuh"
#include "backend/kv_cache_layout.h"

namespace dsv4::cuda {

// Shared with sparse_mla_decode.cu (its smem size decides how many CTAs fit on one SM).
int sparse_mla_ctas_per_sm(int heads_per_cta, int block_entries, int row_group_warps);

namespace {

namespace kl = dsv4::kv_layout;
constexpr int kWindow = 128;
constexpr int kPlanThreads = 1024;
constexpr int kListThreads = 256;

// Exclusive scan of one int per thread over the block; returns the thread's offset, *total = sum.
__device__ int block_exclusive_scan(int v, int* total) {
  __shared__ int warp_sums[kPlanThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int w = warp_sums[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    warp_sums[lane] = w;  // inclusive
  }
  __syncthreads();
  const int before = (warp ? warp_sums[warp - 1] : 0) + x - v;
  *total = warp_sums[kPlanThreads / 32 - 1];
  __syncthreads();  // warp_sums is reused by the next call
  return before;
}

// One CTA. Thread t owns the contiguous job range [t·per, (t+1)·per) so both scans keep job order.
__global__ void __launch_bounds__(kPlanThreads) sparse_mla_plan_kernel(
    const int32_t* __restrict__ list_lengths, int num_queries, int list_stride, int head_groups, int block,
    int grid_ctas, int32_t* __restrict__ meta, int32_t* __restrict__ job_unit_start,
    int32_t* __restrict__ job_first_piece, int4* __restrict__ cta_first_piece) {
  pdl_wait();  // the list lengths come from an earlier kernel
  pdl_launch_dependents();
  const int jobs = num_queries * head_groups;
  const int per = (jobs + kPlanThreads - 1) / kPlanThreads;
  const int j0 = min(jobs, int(threadIdx.x) * per), j1 = min(jobs, j0 + per);
  auto units_of = [&](int job) {
    const int q = job / head_groups;
    const int len = list_lengths ? min(list_lengths[q], list_stride) : list_stride;
    return max(1, (len + block - 1) / block);  // an empty list still writes its (zero) output
  };
  int mine = 0;
  for (int j = j0; j < j1; ++j) mine += units_of(j);
  int total_units = 0;
  const int unit0 = block_exclusive_scan(mine, &total_units);
  const int per_cta = max(1, (total_units + grid_ctas - 1) / grid_ctas);
  // Pieces of a job = the CTAs its unit range touches.
  int pieces = 0;
  for (int j = j0, u = unit0; j < j1; ++j) {
    const int n = units_of(j);
    pieces += (u + n - 1) / per_cta - u / per_cta + 1;
    u += n;
  }
  int total_pieces = 0;
  const int piece0 = block_exclusive_scan(pieces, &total_pieces);
  for (int j = j0, u = unit0, p = piece0; j < j1; ++j) {
    const int n = units_of(j);
    job_unit_start[j] = u;
    job_first_piece[j] = p;
    p += (u + n - 1) / per_cta - u / per_cta + 1;
    u += n;
  }
  if (threadIdx.x == 0) {
    job_unit_start[jobs] = total_units;
    job_first_piece[jobs] = total_pieces;
    meta[0] = per_cta;
    meta[1] = total_units;
  }
  __syncthreads();  // the job tables above are visible to the whole block
  // Each CTA's first piece, so that a decode CTA starts with one load: the job holding its first
  // unit (binary search), the piece's blocks inside that job and its partial slot.
  for (int c = threadIdx.x; c < grid_ctas; c += kPlanThreads) {
    const int unit = c * per_cta;
    if (unit >= total_units) {
      cta_first_piece[c] = make_int4(-1, 0, 0, 0);  // no work
      continue;
    }
    int lo = 0, hi = jobs - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (job_unit_start[mid] <= unit) lo = mid; else hi = mid - 1;
    }
    const int u = job_unit_start[lo], n = job_unit_start[lo + 1] - u;
    const int first_piece = job_first_piece[lo], pieces = job_first_piece[lo + 1] - first_piece;
    cta_first_piece[c] = make_int4(lo, unit - u, min(u + n, unit + per_cta) - u,
                                   pieces == 1 ? -1 : first_piece + c - u / per_cta);
  }
}

__global__ void build_sparse_mla_lists_kernel(SparseMlaListArgs a) {
  const int stride = kWindow + a.compressed_capacity;
  const int t = blockIdx.y;
  const int seq = a.query_seq[t], pos = a.query_pos[t];
  const int ring = a.window_pages * kl::kEntriesPerPage;
  int avail = 0;
  if (a.set == SparseMlaCompressed::Selected) avail = min(min(a.topk_stride, a.compressed_capacity), (pos + 1) / a.ratio);
  if (a.set == SparseMlaCompressed::All) avail = min(a.compressed_capacity, (pos + 1) / a.ratio);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < stride; i += gridDim.x * blockDim.x) {
    int32_t g = -1;
    if (i < kWindow) {
      const int p = max(0, pos - (kWindow - 1)) + i;
      if (p <= pos) {
        const int slot = p % ring;
        g = a.window_block_table[size_t(seq) * a.window_pages + slot / kl::kEntriesPerPage] * kl::kEntriesPerPage +
            slot % kl::kEntriesPerPage;
      }
    } else {
      const int c = i - kWindow;
      int j = -1;
      if (a.set == SparseMlaCompressed::Selected && c < a.topk_stride) j = a.topk[size_t(t) * a.topk_stride + c];
      if (a.set == SparseMlaCompressed::All && c < avail) j = c;
      if (j >= 0)
        g = a.compressed_block_table[size_t(seq) * a.compressed_pages_stride + j / kl::kEntriesPerPage] *
                kl::kEntriesPerPage + j % kl::kEntriesPerPage;
    }
    a.lists[size_t(t) * stride + i] = g;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) a.lengths[t] = kWindow + avail;
}

}  // namespace

SparseMlaTile sparse_mla_select_tile(const SparseMlaShape& shape, const DeviceLimits& limits) {
  DSV4_CHECK(shape.n_heads == 16 || shape.n_heads == 32 || shape.n_heads == 64,
             "sparse MLA: n_heads must be 16, 32 or 64, got {}", shape.n_heads);
  // The wgmma kernel: 64 heads × 64-entry blocks, 2 K buffers, one CTA per SM; an sm_90 GPU that
  // runs the sm_90a code (by capability: no other GPU takes it).
  const bool wgmma_runs = limits.is_sm90() && limits.sm90a_code;
  const bool wgmma_fits = shape.n_heads == 64 && shape.split_kv && !shape.fused_combine && !shape.reference_rounding &&
                          (shape.heads_per_cta == 0 || shape.heads_per_cta == 64) &&
                          (shape.block_entries == 0 || shape.block_entries == 64) && shape.row_group_warps == 0;
  if (shape.kernel == SparseMlaKernel::Wgmma) {
    DSV4_CHECK(wgmma_runs, "sparse MLA: the wgmma kernel needs an sm_90 GPU and a build with sm_90a");
    DSV4_CHECK(wgmma_fits,
               "sparse MLA: the wgmma kernel takes 64 heads in 64-head × 64-entry tiles, split-KV, separate combine, "
               "no reference rounding");
  }
  DSV4_CHECK(!shape.reference_rounding || (shape.split_kv && !shape.fused_combine),
             "sparse MLA: reference rounding is a mode of split-KV with the separate combine");
  // Auto from 2 queries: on the H200 the wgmma kernel measured 12.0 µs against 13.0 (mma.sync, 32 heads
  // × 32 entries) at 2 queries and 16.3 against 19.9 at 8; at 1 query both are ~11.8 µs
  // (docs/perf/2026-11-30-sparse-mla-wgmma.md).
  if (shape.kernel == SparseMlaKernel::Wgmma ||
      (shape.kernel == SparseMlaKernel::Auto && wgmma_fits && shape.max_queries >= 2 && wgmma_runs)) {
    const SparseMlaTile tile = sparse_mla_wgmma_tile();
    DSV4_CHECK(tile.smem_bytes <= limits.smem_per_block_optin, "sparse MLA: the wgmma kernel's {} B of shared "
               "memory exceed this GPU's {} B per block", tile.smem_bytes, limits.smem_per_block_optin);
    return tile;
  }
  int heads = shape.heads_per_cta;
  if (heads == 0) {
    // Small batches: smaller head groups put more CTAs on the GPU. On the H200 at 1 and 2 queries
    // 16 heads × 32 entries beat 32 × 32 (10.5–10.6 against 11.1–11.2 µs, 11.9 against 12.6) once the
    // combine merged many pieces cheaply (docs/perf/2026-11-30-sparse-mla-combine.md; before it 32 × 32
    // won, docs/perf/sparse_mla_indexer.md). 3–7 queries (mma.sync only where wgmma cannot run) keep 32.
    heads = shape.max_queries >= 8 ? 64 : shape.max_queries <= 2 ? 16 : 32;
  }
  heads = std::min(heads, shape.n_heads);
  DSV4_CHECK(heads == 16 || heads == 32 || heads == 64, "sparse MLA: heads_per_cta must be 16, 32 or 64");
  int block = shape.block_entries ? shape.block_entries : shape.max_queries >= 8 ? 64 : 32;
  DSV4_CHECK(block == 32 || block == 64, "sparse MLA: block_entries must be 32 or 64, got {}", block);
  // The fused combine is compiled only into the 2-warp form (the 4-warp form has no registers to spare).
  // One 16-head group of 64-entry blocks (a decode step of 1–2 queries: four CTAs for 64 heads)
  // takes 8 warps, each 8 entries of S and 64 dims of O: the CTA's chain of dequantisation and
  // products per block is then half as long.
  const auto eight = [&] { return heads == 16 && block == 64; };
  int warps = shape.row_group_warps ? shape.row_group_warps : shape.fused_combine ? 2 : eight() ? 8 : 4;
  DSV4_CHECK(warps == 2 || warps == 4 || (warps == 8 && eight()),
             "sparse MLA: row_group_warps must be 2 or 4 (or 8 with 16 heads per CTA and 64-entry blocks), got {}",
             warps);
  DSV4_CHECK(!shape.fused_combine || warps == 2, "sparse MLA: the fused combine needs row_group_warps 2");
  // Where the tile's shared memory exceeds the block limit (sm_120: 99 KB; every tile fits the H200's
  // 227 KB), 32-entry blocks, then smaller head groups: the tiles of 16 or 32 heads × 32 entries
  // (70–88 KB) fit there.
  auto fits = [&] { return sparse_mla_mma_tile(heads, block, warps).smem_bytes <= limits.smem_per_block_optin; };
  if (!fits() && shape.block_entries == 0 && block == 64) {
    block = 32;
    if (warps == 8 && shape.row_group_warps == 0) warps = 4;  // 8 warps take 64-entry blocks only
  }
  DSV4_CHECK(warps != 8 || eight(), "sparse MLA: 8 warps per row group take 16 heads × 64 entries only ({} × {} here)",
             heads, block);
  while (!fits() && shape.heads_per_cta == 0 && heads > 16) heads /= 2;
  const SparseMlaTile tile = sparse_mla_mma_tile(heads, block, warps);
  DSV4_CHECK(fits(), "sparse MLA decode: the {}-head × {}-entry tile ({} B) does not fit this GPU's shared memory "
             "({} B per block)", heads, block, tile.smem_bytes, limits.smem_per_block_optin);
  return tile;
}

std::vector<KernelLaunch> sparse_mla_kernel_launches(const DeviceLimits& limits) {
  // Every shape a caller can ask for: the backend's (Auto, any batch bucket, split or not) and the
  // forced ones of tests and benchmarks; a shape that cannot run there fails in the plan, launching nothing.
  std::vector<KernelLaunch> out;
  auto add = [&](const KernelLaunch& k) {
    for (const KernelLaunch& o : out)
      if (o.kernel == k.kernel && o.threads == k.threads && o.dynamic_smem == k.dynamic_smem) return;
    out.push_back(k);
  };
  using K = SparseMlaKernel;
  for (int n_heads : {16, 32, 64})
    for (int max_queries : {1, 2, 3, 4, 7, 8, 16, 64, 128, 1024})
      for (int hpc : {0, 16, 32, 64})
        for (int block : {0, 32, 64})
          for (int warps : {0, 2, 4, 8})
            for (int flags = 0; flags < 4; ++flags)
              for (K kernel : {K::Auto, K::MmaSync, K::Wgmma}) {
                SparseMlaShape shape;
                shape.n_heads = n_heads;
                shape.max_queries = max_queries;
                shape.heads_per_cta = hpc;
                shape.block_entries = block;
                shape.row_group_warps = warps;
                shape.split_kv = (flags & 1) == 0;
                shape.fused_combine = (flags & 2) != 0;
                shape.kernel = kernel;
                SparseMlaTile t;
                try {
                  t = sparse_mla_select_tile(shape, limits);
                } catch (const Error&) {
                  continue;
                }
                if (t.wgmma) {
                  add({"sparse_mla_wgmma_kernel", t.threads, t.smem_bytes});
                  continue;
                }
                // Each mma.sync tile has its reference-rounding max pass beside it, launched with the same
                // block and shared memory.
                for (const char* max_pass : {"false", "true"})
                  add({fmt::format("sparse_mla_decode_kernel<{}, {}, {}, {}>", t.heads_per_cta, t.block_entries,
                                   t.row_group_warps, max_pass),
                       t.threads, t.smem_bytes});
              }
  add({"sparse_mla_combine_kernel<1>", sparse_mla_detail::kCombineThreads, 0});
  add({"sparse_mla_combine_kernel<4>", sparse_mla_detail::kCombineThreads, 0});
  add({"sparse_mla_plan_kernel", kPlanThreads, 0});
  add({"build_sparse_mla_lists_kernel", kListThreads, 0});
  return out;
}

SparseMlaPlan::SparseMlaPlan(const SparseMlaShape& shape) : shape_(shape) {
  const SparseMlaTile tile = sparse_mla_select_tile(shape, current_device_limits());
  wgmma_ = tile.wgmma;
  heads_per_cta_ = tile.heads_per_cta;
  block_entries_ = tile.block_entries;
  row_group_warps_ = wgmma_ ? 4 : tile.row_group_warps;  // (mma.sync's; reported as 4 for wgmma, as before)
  // Also sets the kernel's smem limit.
  const int ctas_per_sm = wgmma_ ? 1 : sparse_mla_ctas_per_sm(heads_per_cta_, block_entries_, row_group_warps_);
  DSV4_CHECK(ctas_per_sm > 0, "sparse MLA decode: the {}-head × {}-entry tile does not fit this GPU's shared memory",
             heads_per_cta_, block_entries_);
  const int head_groups = shape.n_heads / heads_per_cta_;
  num_jobs_ = shape.max_queries * head_groups;
  const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  grid_ctas_ = shape.split_kv ? sms * ctas_per_sm : num_jobs_;
  computed_ = make_tables();
  job_done_ = DeviceBuffer<int32_t>(num_jobs_);
  job_done_.fill_bytes(0);
  DSV4_CUDA_CHECK(cudaDeviceSynchronize());  // zeroed before any capture
  if (shape.split_kv) {
    // Pieces ≤ Σ_j (units_j / P + 1) ≤ grid + jobs.
    const size_t max_pieces = size_t(grid_ctas_) + num_jobs_;
    partial_acc_ = DeviceBuffer<float>(max_pieces * heads_per_cta_ * kl::kHeadDim);
    partial_ml_ = DeviceBuffer<float2>(max_pieces * heads_per_cta_);
    if (shape.reference_rounding) piece_max_ = DeviceBuffer<float>(max_pieces * heads_per_cta_);
  }
}

SparseMlaPlan::Tables SparseMlaPlan::make_tables() const {
  return Tables{DeviceBuffer<int32_t>(2), DeviceBuffer<int32_t>(num_jobs_ + 1), DeviceBuffer<int32_t>(num_jobs_ + 1),
                DeviceBuffer<int4>(std::max(grid_ctas_, 1))};
}

void SparseMlaPlan::launch(const int32_t* list_lengths, int num_queries, int list_stride, const Tables& t,
                           cudaStream_t stream) {
  DSV4_CHECK(num_queries <= shape_.max_queries, "sparse MLA plan: {} queries > max {}", num_queries,
             shape_.max_queries);
  current_ = &t;
  settled_ = false;
  if (!shape_.split_kv) return;  // the unsplit kernel maps CTA = job
  launch_programmatic(sparse_mla_plan_kernel, dim3(1), dim3(kPlanThreads), 0, stream, list_lengths, num_queries,
                      list_stride, shape_.n_heads / heads_per_cta_, block_entries_, grid_ctas_, t.meta.get(),
                      t.job_unit_start.get(), t.job_first_piece.get(), t.cta_first_piece.get());
}

void SparseMlaPlan::compute(const int32_t* list_lengths, int num_queries, int list_stride, cudaStream_t stream) {
  launch(list_lengths, num_queries, list_stride, computed_, stream);
}

void SparseMlaPlan::compute_once(int num_queries, int list_stride, cudaStream_t stream) {
  if (!shape_.split_kv) return compute(nullptr, num_queries, list_stride, stream);  // (no tables to keep)
  const auto key = std::make_pair(num_queries, list_stride);
  if (auto it = once_.find(key); it != once_.end()) {
    current_ = &it->second;  // written by a launch in an earlier call, on the stream
    settled_ = true;
    return;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  DSV4_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    // No allocation inside a recording: the shared tables, computed in it.
    launch(nullptr, num_queries, list_stride, computed_, stream);
    return;
  }
  launch(nullptr, num_queries, list_stride, once_.emplace(key, make_tables()).first->second, stream);
}

SparseMlaPlan::View SparseMlaPlan::view() const {
  return View{current_->meta.get(), current_->job_unit_start.get(), current_->job_first_piece.get(),
              current_->cta_first_piece.get(), partial_acc_.get(), partial_ml_.get(), piece_max_.get(),
              job_done_.get(), num_jobs_, settled_};
}

void build_sparse_mla_lists(const SparseMlaListArgs& args, cudaStream_t stream) {
  if (args.num_queries <= 0) return;
  const int stride = kWindow + args.compressed_capacity;
  dim3 grid((stride + kListThreads - 1) / kListThreads, args.num_queries);
  build_sparse_mla_lists_kernel<<<grid, kListThreads, 0, stream>>>(args);
  DSV4_CUDA_CHECK_LAUNCH();
}

}  // namespace dsv4::cuda
