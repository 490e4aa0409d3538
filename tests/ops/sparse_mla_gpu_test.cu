// Sparse-MLA decode on the GPU against the CPU reference (cpu/sparse_mla_reference.h) on fresh
// random data: window-only, CSA with top-k, HCA with 1, 2 and 500 compressed entries, sequences
// shorter than the window, s_q 1–4, mixed lengths, tensor-parallel head counts, head groups,
// split-KV and the unsplit baseline, two pools, CUDA-graph replay. Outputs are poisoned (NaN) before
// every launch or replay.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/sparse_mla_reference.h"
#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/sparse_mla_decode.h"
#include "backend/kv_cache_layout.h"
#include "core/dtypes.h"
#include "gpu_test_rng.h"

namespace dsv4::cuda {
namespace {

namespace kl = dsv4::kv_layout;
constexpr int kD = 512;
constexpr int kWindowPages = 3;  // ring of 192 slots: room for s_q ≤ 4 new tokens per step

std::mt19937& rng() { return test::fresh_rng("sparse_mla_gpu_test"); }

struct Case {
  int n_heads = 64;
  int heads_per_cta = 0;
  int block_entries = 0;
  int row_group_warps = 0;
  bool split = true;
  bool fused_combine = false;  // the default path; the fused one runs where a test says so
  SparseMlaKernel kernel = SparseMlaKernel::MmaSync;  // the wgmma kernel runs in its own tests
  SparseMlaCompressed set = SparseMlaCompressed::None;
  int ratio = 4;
  int topk = 512;
  std::vector<int> last_pos;  // per sequence
  std::vector<int> s_q;       // per sequence (default 1)
  bool two_pools = false;
  bool graph = false;
  float q_scale = 2.0f;
  int max_mag_exp = 3;  // per-64-dim-group magnitudes 2^-3 … 2^max_mag_exp
  // Each sequence's position-0 entry takes scale codes 7s … 7s + 6 (mod 255): every e8m0 code but
  // NaN over 37 sequences (set_scale_codes).
  bool every_scale_code = false;
  bool no_sink = false;  // sink logit −1e30: its weight is exactly 0
  bool exact = false;    // outputs must equal the reference's bit for bit (else rel L2 ≤ 1e-2)
  bool reference_rounding = false;  // split pieces start from the running maximum before them
  // Also run the unsplit kernel on the same inputs and hold this launch to it: P is then rounded
  // against the same maxima, so only the f32 order of the combine differs — every output within
  // one bf16 ulp plus 1e-5 of its (query, head)'s largest |output|.
  bool match_unsplit = false;
  // The model's form: lists walked to their stride (no lengths), the plan by compute_once — launched
  // twice, the second time (and in a recording) with its tables settled, read before the wait.
  bool plan_once = false;
};

// Fills every entry of a pool with random KV vectors (per-block magnitudes vary) in the FP8 layout.
std::vector<uint8_t> random_pool(int pages, int max_mag_exp) {
  std::vector<uint8_t> pool(size_t(pages) * kl::kKvPageBytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : pool) b = uint8_t(byte(rng()));  // padding and unused bytes hold garbage
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> e(-3, max_mag_exp);
  std::vector<float> v(kD);
  for (int64_t g = 0; g < int64_t(pages) * kl::kEntriesPerPage; ++g) {
    for (int b = 0; b < 8; ++b) {
      const float mag = std::ldexp(1.0f, e(rng()));
      for (int i = 0; i < 64; ++i) v[b * 64 + i] = round_bf16(nd(rng()) * mag);
    }
    kl::encode_kv_entry_at(pool.data(), g, v.data());
  }
  return pool;
}

// Entry g with scale codes first_code … first_code + 6 (mod 255, skipping the NaN code 255), random
// e4m3 values whose scaled value is zero or a normal bf16 (|v| in [2^-126, 2^128): the values for
// which "e4m3 · 2^k fits bf16" holds, the dequantiser's exactness claim) and random bf16 RoPE values.
// The encoder never writes codes below 2^-21 (its amax floor), so the 2^-127 code is set here.
void set_scale_codes(uint8_t* pool, int64_t g, int first_code) {
  uint8_t* data = pool + kl::kv_entry_data_offset(g);
  uint8_t* scales = pool + kl::kv_entry_scale_offset(g);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int b = 0; b < kl::kNumScales; ++b) {
    const int code = (first_code + b) % 255;
    scales[b] = uint8_t(code);
    for (int i = 0; i < kl::kScaleBlock; ++i) {
      uint8_t v;
      double mag;
      do {  // e4m3 NaN codes give a NaN magnitude and are drawn again
        v = uint8_t(byte(rng()));
        mag = std::fabs(double(e4m3_to_f32(v))) * std::ldexp(1.0, code - 127);
      } while (!(mag == 0 || (mag >= std::ldexp(1.0, -126) && mag < std::ldexp(1.0, 128))));
      data[b * kl::kScaleBlock + i] = v;
    }
  }
  for (int i = 0; i < kl::kRopeDim; ++i) {
    const uint16_t h = f32_to_bf16(nd(rng()));
    std::memcpy(data + kl::kNopeDim + 2 * i, &h, 2);
  }
}

double run_case(const Case& c) {
  const int seqs = int(c.last_pos.size());
  std::vector<int32_t> query_seq, query_pos;
  for (int s = 0; s < seqs; ++s) {
    const int sq = c.s_q.empty() ? 1 : c.s_q[s];
    for (int i = sq - 1; i >= 0; --i) {
      query_seq.push_back(s);
      query_pos.push_back(std::max(0, c.last_pos[s] - i));
    }
  }
  const int T = int(query_seq.size());
  int max_avail = 0;
  for (int p : c.last_pos) max_avail = std::max(max_avail, (p + 1) / c.ratio);
  const int capacity = c.set == SparseMlaCompressed::Selected ? c.topk
                       : c.set == SparseMlaCompressed::All    ? std::max(1, max_avail)
                                                              : 0;
  const int comp_pages = std::max(1, (max_avail + kl::kEntriesPerPage - 1) / kl::kEntriesPerPage);
  // Page ids: a random permutation, so that sequences' pages interleave in the pool.
  const int window_pool_pages = seqs * kWindowPages + (c.two_pools ? 1 : seqs * comp_pages) + 1;
  const int comp_pool_pages = c.two_pools ? seqs * comp_pages + 2 : window_pool_pages;
  std::vector<int32_t> perm(window_pool_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng());
  std::vector<int32_t> window_table(size_t(seqs) * kWindowPages), comp_table(size_t(seqs) * comp_pages);
  int next = 0;
  for (auto& p : window_table) p = perm[next++];
  if (c.two_pools) {
    std::vector<int32_t> perm2(comp_pool_pages);
    std::iota(perm2.begin(), perm2.end(), 0);
    std::shuffle(perm2.begin(), perm2.end(), rng());
    for (size_t i = 0; i < comp_table.size(); ++i) comp_table[i] = perm2[i];
  } else {
    for (auto& p : comp_table) p = perm[next++];
  }
  std::vector<uint8_t> window_pool = random_pool(window_pool_pages, c.max_mag_exp);
  std::vector<uint8_t> comp_pool =
      c.two_pools ? random_pool(comp_pool_pages, c.max_mag_exp) : std::vector<uint8_t>();
  const std::vector<uint8_t>& comp_pool_ref = c.two_pools ? comp_pool : window_pool;
  if (c.every_scale_code)  // position 0 lies in slot 0 of the sequence's first window page
    for (int s = 0; s < seqs; ++s)
      set_scale_codes(window_pool.data(), int64_t(window_table[size_t(s) * kWindowPages]) * kl::kEntriesPerPage, 7 * s);

  // CSA selections: distinct random available entries in random order, −1 padded.
  std::vector<int32_t> topk(size_t(T) * std::max(1, c.topk), -1);
  if (c.set == SparseMlaCompressed::Selected) {
    for (int t = 0; t < T; ++t) {
      const int avail = (query_pos[t] + 1) / c.ratio;
      std::vector<int32_t> all(avail);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng());
      for (int i = 0; i < std::min(avail, c.topk); ++i) topk[size_t(t) * c.topk + i] = all[i];
    }
  }
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> q(size_t(T) * c.n_heads * kD);
  for (auto& x : q) x = f32_to_bf16(nd(rng()) * c.q_scale);
  std::vector<float> sink(c.n_heads);
  for (auto& x : sink) x = c.no_sink ? -1e30f : nd(rng()) * 2.f;

  // CPU lists and reference output.
  cpu::SparseMlaListInputs li;
  li.num_queries = T;
  li.query_seq = query_seq.data();
  li.query_pos = query_pos.data();
  li.window_block_table = window_table.data();
  li.window_pages = kWindowPages;
  li.compressed_block_table = comp_table.data();
  li.compressed_pages_stride = comp_pages;
  li.set = c.set == SparseMlaCompressed::Selected ? cpu::CompressedSet::Selected
           : c.set == SparseMlaCompressed::All    ? cpu::CompressedSet::All
                                                  : cpu::CompressedSet::None;
  li.topk = topk.data();
  li.topk_stride = c.topk;
  li.ratio = c.ratio;
  li.compressed_capacity = capacity;
  const int stride = 128 + capacity;
  std::vector<int32_t> lists(size_t(T) * stride), lengths(T);
  cpu::build_sparse_mla_lists_reference(li, lists.data(), lengths.data());
  std::vector<uint16_t> want(q.size());
  cpu::SparseMlaLists rl{lists.data(), lengths.data(), stride, 128};
  const float scale = 1.0f / std::sqrt(512.0f);
  cpu::sparse_mla_decode_reference(q.data(), T, c.n_heads, window_pool.data(), comp_pool_ref.data(), rl, sink.data(),
                                   scale, want.data());

  // GPU: lists built on the device, plan, decode.
  Stream stream;
  DeviceBuffer<uint8_t> d_wpool(window_pool.size()), d_cpool(comp_pool.size());
  d_wpool.upload(window_pool, stream.get());
  if (c.two_pools) d_cpool.upload(comp_pool, stream.get());
  DeviceBuffer<int32_t> d_seq(T), d_pos(T), d_wt(window_table.size()), d_ct(comp_table.size()), d_topk(topk.size());
  d_seq.upload(query_seq, stream.get());
  d_pos.upload(query_pos, stream.get());
  d_wt.upload(window_table, stream.get());
  d_ct.upload(comp_table, stream.get());
  d_topk.upload(topk, stream.get());
  DeviceBuffer<int32_t> d_lists(lists.size()), d_lengths(T);
  d_lists.fill_bytes(0x7f, stream.get());
  d_lengths.fill_bytes(0x7f, stream.get());
  SparseMlaListArgs la;
  la.num_queries = T;
  la.query_seq = d_seq.get();
  la.query_pos = d_pos.get();
  la.window_block_table = d_wt.get();
  la.window_pages = kWindowPages;
  la.compressed_block_table = d_ct.get();
  la.compressed_pages_stride = comp_pages;
  la.set = c.set;
  la.topk = d_topk.get();
  la.topk_stride = c.topk;
  la.ratio = c.ratio;
  la.compressed_capacity = capacity;
  la.lists = d_lists.get();
  la.lengths = d_lengths.get();
  build_sparse_mla_lists(la, stream.get());
  EXPECT_EQ(d_lists.download(stream.get()), lists) << "device entry lists differ from the CPU's";
  EXPECT_EQ(d_lengths.download(stream.get()), lengths);

  DeviceBuffer<__nv_bfloat16> d_q(q.size()), d_out(q.size());
  d_q.upload(reinterpret_cast<const __nv_bfloat16*>(q.data()), q.size(), stream.get());
  DeviceBuffer<float> d_sink(c.n_heads);
  d_sink.upload(sink, stream.get());

  SparseMlaShape shape;
  shape.max_queries = T;
  shape.n_heads = c.n_heads;
  shape.heads_per_cta = c.heads_per_cta;
  shape.block_entries = c.block_entries;
  shape.row_group_warps = c.row_group_warps;
  shape.split_kv = c.split;
  shape.fused_combine = c.fused_combine;
  shape.kernel = c.kernel;
  shape.reference_rounding = c.reference_rounding;
  SparseMlaPlan plan(shape);
  SparseMlaArgs a;
  a.q = d_q.get();
  a.window_pool = d_wpool.get();
  a.compressed_pool = c.two_pools ? d_cpool.get() : d_wpool.get();
  a.lists = d_lists.get();
  a.list_lengths = c.plan_once ? nullptr : d_lengths.get();
  a.list_stride = stride;
  a.sink = d_sink.get();
  a.scale = scale;
  a.out = d_out.get();
  a.num_queries = T;
  // Downloads the output of the launch just made and checks it against the reference.
  auto check = [&](const char* launch) {
    DSV4_CUDA_CHECK(cudaGetLastError());
    std::vector<__nv_bfloat16> got_raw = d_out.download(stream.get());
    double err2 = 0, ref2 = 0, max_abs = 0;
    int bad = 0, differ = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      uint16_t bits;
      std::memcpy(&bits, &got_raw[i], 2);
      const double g = bf16_to_f32(bits), w = bf16_to_f32(want[i]);
      if (!std::isfinite(g)) {
        if (++bad < 5) ADD_FAILURE() << launch << ": non-finite output at " << i;
        continue;
      }
      if (c.exact && g != w && ++differ <= 5)
        ADD_FAILURE() << launch << ": output " << i << " (query " << i / (size_t(c.n_heads) * kD) << ", dim " << i % kD
                      << ") is " << g << ", the reference " << w;
      err2 += (g - w) * (g - w);
      ref2 += w * w;
      max_abs = std::max(max_abs, std::fabs(g - w));
    }
    EXPECT_EQ(bad, 0) << launch;
    const double rel = std::sqrt(err2 / std::max(ref2, 1e-30));
    std::printf("  T=%d heads=%d hpc=%d block=%d split=%d fused=%d %s stride=%d %s: rel L2 %.3g, max abs %.3g\n", T,
                c.n_heads, plan.heads_per_cta(), plan.block_entries(), int(c.split), int(c.fused_combine),
                plan.wgmma() ? "wgmma" : "mma.sync", stride, launch, rel, max_abs);
    if (c.exact)
      EXPECT_EQ(differ, 0) << launch << ": outputs differ from the reference";
    else
      EXPECT_LE(rel, 1e-2) << launch;
    return rel;
  };
  double rel = 0;
  auto compute_plan = [&](cudaStream_t s) {
    if (c.plan_once)
      plan.compute_once(T, stride, s);
    else
      plan.compute(d_lengths.get(), T, stride, s);
  };
  if (c.graph) {
    if (c.plan_once) plan.compute_once(T, stride, stream.get());  // the recording's tables settled
    Graph graph;
    graph.capture(stream.get(), [&](cudaStream_t s) {
      compute_plan(s);
      sparse_mla_decode(plan, a, s);
    });
    // Poisoned before each replay, so that the second must write every output itself (the fused
    // combine's per-job counters must be back at zero after the first).
    for (const char* replay : {"replay 1", "replay 2"}) {
      d_out.fill_bytes(0xff, stream.get());  // NaN poison
      graph.launch(stream.get());
      rel = std::max(rel, check(replay));
    }
  } else {
    for (const char* launch : {"launch", "settled plan"}) {
      if (launch[0] == 's' && !c.plan_once) break;
      d_out.fill_bytes(0xff, stream.get());  // NaN poison
      compute_plan(stream.get());
      sparse_mla_decode(plan, a, stream.get());
      rel = std::max(rel, check(launch));
    }
  }
  if (c.match_unsplit) {
    const std::vector<__nv_bfloat16> split_out = d_out.download(stream.get());
    SparseMlaShape unsplit = shape;
    unsplit.split_kv = false;
    unsplit.reference_rounding = false;
    unsplit.fused_combine = false;
    SparseMlaPlan base(unsplit);
    d_out.fill_bytes(0xff, stream.get());
    base.compute(d_lengths.get(), T, stride, stream.get());
    sparse_mla_decode(base, a, stream.get());
    const std::vector<__nv_bfloat16> base_out = d_out.download(stream.get());
    size_t same = 0, beyond = 0;
    double worst = 0;  // in units of the allowance
    for (size_t row = 0; row < base_out.size() / kD; ++row) {
      auto value = [](const __nv_bfloat16& v) {
        uint16_t bits;
        std::memcpy(&bits, &v, 2);
        return double(bf16_to_f32(bits));
      };
      double peak = 0;
      for (int d = 0; d < kD; ++d) peak = std::max(peak, std::fabs(value(base_out[row * kD + d])));
      for (int d = 0; d < kD; ++d) {
        const double x = value(split_out[row * kD + d]), y = value(base_out[row * kD + d]);
        const double big = std::max(std::fabs(x), std::fabs(y));
        const double ulp = big > 0 ? std::ldexp(1.0, std::ilogb(big) - 7) : 0;
        const double allowed = ulp + 1e-5 * peak, diff = std::fabs(x - y);
        same += diff == 0;
        beyond += !(diff <= allowed);
        if (allowed > 0) worst = std::max(worst, diff / allowed);
      }
    }
    std::printf("  against the unsplit kernel on the same inputs: %.3f%% bit-identical, worst %.2f× the allowance, "
                "%zu beyond\n", 100.0 * double(same) / double(base_out.size()), worst, beyond);
    EXPECT_EQ(beyond, 0u) << "split-KV with reference rounding against the unsplit kernel";
  }
  return rel;
}

TEST(SparseMlaGpu, WindowOnlyIncludingShortSequences) {
  Case c;
  c.last_pos = {0, 5, 63, 64, 127, 128, 1000};
  run_case(c);
}

TEST(SparseMlaGpu, CsaTopk512MixedLengths) {
  Case c;
  c.set = SparseMlaCompressed::Selected;
  c.last_pos = {3, 100, 2046, 2047, 2048, 5000, 20000};
  run_case(c);
}

TEST(SparseMlaGpu, HcaWith1And2And500Entries) {
  Case c;
  c.set = SparseMlaCompressed::All;
  c.ratio = 128;
  c.last_pos = {50, 127, 300, 500 * 128 - 1, 500 * 128 + 77};
  run_case(c);
}

TEST(SparseMlaGpu, MtpSq1To4) {
  Case c;
  c.set = SparseMlaCompressed::Selected;
  c.last_pos = {2, 130, 4000, 9000};
  c.s_q = {4, 3, 2, 1};
  run_case(c);
  c.set = SparseMlaCompressed::All;
  c.ratio = 128;
  c.last_pos = {126, 129, 70000};
  c.s_q = {2, 4, 3};
  run_case(c);
}

TEST(SparseMlaGpu, HeadCountsHeadGroupsBlockSizesAndUnsplitBaseline) {
  for (int heads : {64, 32, 16})
    for (int hpc : {16, 32, 64}) {
      if (hpc > heads) continue;
      for (int block : {64, 32})
        for (bool split : {true, false}) {
          Case c;
          c.n_heads = heads;
          c.heads_per_cta = hpc;
          c.block_entries = block;
          c.split = split;
          c.fused_combine = hpc != 32;  // both combine paths, and both warp counts (fused: 2 warps)
          c.set = SparseMlaCompressed::Selected;
          c.last_pos = {700, 3000};
          c.s_q = {1, 2};
          run_case(c);
        }
    }
}

// 8 warps per row group (16 heads × 64-entry blocks, the 1–2 query default): split and whole-list,
// SWA-, HCA- and CSA-sized lists, against the CPU reference.
TEST(SparseMlaGpu, EightWarpsPerRowGroup) {
  for (bool split : {true, false})
    for (auto set : {SparseMlaCompressed::None, SparseMlaCompressed::Selected}) {
      Case c;
      c.heads_per_cta = 16;
      c.block_entries = 64;
      c.row_group_warps = 8;
      c.split = split;
      c.fused_combine = false;
      c.set = set;
      c.last_pos = {4095, 130, 3000};
      c.s_q = {1, 2, 1};
      run_case(c);
    }
}

// Entries whose scale exceeds 2^15 (or is 2^-127) take the dequantiser's f32 path, the rest the
// bit-moving one; both must be exact. One entry per query (every sequence at position 0), q = 0 and
// no sink: each output is its entry's value times a weight of exactly 1, so it must equal the
// reference (and the decoded entry) bit for bit, over every e8m0 scale code.
void check_every_scale_code(Case c) {
  c.every_scale_code = true;
  c.no_sink = true;
  c.exact = true;
  c.q_scale = 0.f;
  c.set = SparseMlaCompressed::None;
  c.last_pos.assign(37, 0);  // 37 × 7 groups ≥ 255 codes
  run_case(c);
}

TEST(SparseMlaGpu, EveryScaleCodeDequantisesExactly) {
  for (int block : {64, 32})
    for (bool split : {true, false}) {
      Case c;
      c.block_entries = block;
      c.split = split;
      check_every_scale_code(c);
    }
}

// Attention over entries with scales up to 2^24 (many on the f32 path), within the attention tolerance.
TEST(SparseMlaGpu, LargeScalesWithinTolerance) {
  for (int block : {64, 32}) {
    Case c;
    c.block_entries = block;
    c.max_mag_exp = 24;
    c.q_scale = 0.5f;
    c.fused_combine = false;
    c.set = SparseMlaCompressed::Selected;
    c.last_pos = {900, 4000};
    run_case(c);
  }
}

TEST(SparseMlaGpu, TwoPoolsAndLargeBatchSplits) {
  Case c;
  c.two_pools = true;
  c.set = SparseMlaCompressed::Selected;
  std::uniform_int_distribution<int> pos(0, 30000);
  for (int i = 0; i < 40; ++i) c.last_pos.push_back(pos(rng()));
  c.heads_per_cta = 64;
  c.fused_combine = true;
  run_case(c);
  c.fused_combine = false;
  run_case(c);
  c.row_group_warps = 2;
  run_case(c);
}

TEST(SparseMlaGpu, TopkOtherThan512AndPeakySoftmax) {
  Case c;
  c.set = SparseMlaCompressed::Selected;
  c.topk = 2048;
  c.q_scale = 6.0f;
  c.last_pos = {9000, 20000, 100};
  run_case(c);
}

// Split pieces that start from the running maximum before them round P as the unsplit kernel does:
// CSA lists of 640 entries (10 blocks over many pieces at 1 query), HCA with 500 entries, s_q > 1,
// every head-group size, one and several queries, in a CUDA graph too.
TEST(SparseMlaGpu, ReferenceRoundingMatchesTheUnsplitKernel) {
  for (int hpc : {16, 32, 64}) {
    Case c;
    c.heads_per_cta = hpc;
    c.block_entries = 64;
    c.reference_rounding = true;
    c.match_unsplit = true;
    c.set = SparseMlaCompressed::Selected;
    c.last_pos = {20000};
    run_case(c);
    c.last_pos = {5000, 60, 12000, 3000};
    c.q_scale = 6.0f;  // peaky: the maxima move between pieces
    run_case(c);
  }
  Case c;
  c.block_entries = 64;
  c.reference_rounding = true;
  c.match_unsplit = true;
  c.set = SparseMlaCompressed::All;
  c.ratio = 128;
  c.last_pos = {500 * 128 + 77, 300};
  c.s_q = {2, 1};
  run_case(c);
  c.set = SparseMlaCompressed::Selected;
  c.ratio = 4;
  c.last_pos = {9000, 2046};
  c.s_q = {1, 1};
  c.graph = true;
  run_case(c);
  // The model's form at one and four queries, launched and recorded.
  c.plan_once = true;
  c.s_q.clear();
  for (bool graph : {false, true}) {
    c.graph = graph;
    c.last_pos = {9000};
    run_case(c);
    c.last_pos = {9000, 2046, 700, 30000};
    run_case(c);
  }
}

TEST(SparseMlaGpu, CudaGraphReplay) {
  Case c;
  c.set = SparseMlaCompressed::Selected;
  c.last_pos = {5000, 60, 12000};
  c.graph = true;
  c.fused_combine = true;
  run_case(c);  // fused combine: its per-job counters must be back at zero for the second replay
  c.fused_combine = false;
  run_case(c);
}

// The plan's tables as the decode kernel reads them (view()) for `queries` queries, downloaded (the
// job tables hold entries for the plan's maximum; a schedule writes its own jobs' and one more).
std::vector<int32_t> plan_tables(const SparseMlaPlan& plan, int queries) {
  const SparseMlaPlan::View v = plan.view();
  const size_t jobs = size_t(queries) * (plan.shape().n_heads / plan.heads_per_cta()) + 1,
               ctas = size_t(plan.grid_ctas());
  std::vector<int32_t> out(2 + 2 * jobs + 4 * ctas);
  DSV4_CUDA_CHECK(cudaDeviceSynchronize());
  DSV4_CUDA_CHECK(cudaMemcpy(out.data(), v.meta, 2 * 4, cudaMemcpyDeviceToHost));
  DSV4_CUDA_CHECK(cudaMemcpy(out.data() + 2, v.job_unit_start, jobs * 4, cudaMemcpyDeviceToHost));
  DSV4_CUDA_CHECK(cudaMemcpy(out.data() + 2 + jobs, v.job_first_piece, jobs * 4, cudaMemcpyDeviceToHost));
  DSV4_CUDA_CHECK(cudaMemcpy(out.data() + 2 + 2 * jobs, v.cta_first_piece, ctas * 16, cudaMemcpyDeviceToHost));
  return out;
}

void poison_tables(const SparseMlaPlan& plan) {
  const SparseMlaPlan::View v = plan.view();
  const size_t jobs = size_t(v.num_jobs) + 1;
  DSV4_CUDA_CHECK(cudaDeviceSynchronize());  // (the test's stream does not wait for the default one)
  DSV4_CUDA_CHECK(cudaMemset(const_cast<int32_t*>(v.meta), 0xff, 2 * 4));
  DSV4_CUDA_CHECK(cudaMemset(const_cast<int32_t*>(v.job_unit_start), 0xff, jobs * 4));
  DSV4_CUDA_CHECK(cudaMemset(const_cast<int32_t*>(v.job_first_piece), 0xff, jobs * 4));
  DSV4_CUDA_CHECK(cudaMemset(const_cast<int4*>(v.cta_first_piece), 0xff, size_t(plan.grid_ctas()) * 16));
  DSV4_CUDA_CHECK(cudaDeviceSynchronize());
}

// compute_once: each (queries, stride) pair gets the tables compute() makes for lists walked to the
// stride, in tables of its own that later calls select again; a pair first met while the stream
// records is computed in the recording, into the shared tables.
TEST(SparseMlaGpu, PlanComputedOncePerQueriesAndStride) {
  SparseMlaShape shape;
  shape.max_queries = 4;
  shape.n_heads = 64;
  shape.split_kv = true;
  shape.reference_rounding = true;
  shape.block_entries = 64;
  SparseMlaPlan plan(shape);
  Stream stream;
  // compute()'s tables for a pair, into the shared tables (poisoned first).
  auto computed = [&](int queries, int stride) {
    plan.compute(nullptr, 1, 64, stream.get());  // selects the shared tables
    poison_tables(plan);
    plan.compute(nullptr, queries, stride, stream.get());
    return plan_tables(plan, queries);
  };
  const std::vector<int32_t> want_1 = computed(1, 640), want_4 = computed(4, 640), want_3 = computed(3, 200);
  const int32_t* shared = plan.view().meta;
  EXPECT_NE(want_1, want_4);
  plan.compute_once(1, 640, stream.get());
  const int32_t* own_1 = plan.view().meta;
  EXPECT_NE(own_1, shared);
  EXPECT_EQ(plan_tables(plan, 1), want_1);
  poison_tables(plan);  // a second call must not compute again: the poison stays
  plan.compute_once(4, 640, stream.get());
  EXPECT_EQ(plan_tables(plan, 4), want_4);
  plan.compute_once(1, 640, stream.get());
  EXPECT_EQ(plan.view().meta, own_1);
  EXPECT_NE(plan_tables(plan, 1), want_1);
  // Met first in a recording: the shared tables, written by the replay.
  Graph graph;
  graph.capture(stream.get(), [&](cudaStream_t s) { plan.compute_once(3, 200, s); });
  EXPECT_EQ(plan.view().meta, shared);
  poison_tables(plan);
  graph.launch(stream.get());
  EXPECT_EQ(plan_tables(plan, 3), want_3);
  plan.compute_once(3, 200, stream.get());  // outside a recording: tables of its own
  EXPECT_NE(plan.view().meta, shared);
  EXPECT_EQ(plan_tables(plan, 3), want_3);
}

// The sm_90a kernel (64 heads × 64-entry blocks, warp-specialised) on the cases above.
bool wgmma_here() { return sparse_mla_wgmma_available(); }

TEST(SparseMlaGpuWgmma, WindowCsaHcaMtpAndLargeScales) {
  if (!wgmma_here()) GTEST_SKIP() << "the wgmma kernel runs on sm_90 only";
  Case c;
  c.kernel = SparseMlaKernel::Wgmma;
  c.last_pos = {0, 5, 63, 64, 127, 128, 1000};
  run_case(c);
  c.set = SparseMlaCompressed::Selected;
  c.last_pos = {3, 100, 2046, 2047, 2048, 5000, 20000};
  run_case(c);
  c.set = SparseMlaCompressed::All;
  c.ratio = 128;
  c.last_pos = {50, 127, 300, 500 * 128 - 1, 500 * 128 + 77};
  run_case(c);
  c.set = SparseMlaCompressed::Selected;
  c.ratio = 4;
  c.last_pos = {2, 130, 4000, 9000};
  c.s_q = {4, 3, 2, 1};
  run_case(c);
  c.s_q.clear();
  c.max_mag_exp = 24;
  c.q_scale = 0.5f;
  c.last_pos = {900, 4000};
  run_case(c);
  Case every;
  every.kernel = SparseMlaKernel::Wgmma;
  check_every_scale_code(every);
}

TEST(SparseMlaGpuWgmma, ManyJobsPerCtaTwoPoolsTopk2048AndGraphReplay) {
  if (!wgmma_here()) GTEST_SKIP() << "the wgmma kernel runs on sm_90 only";
  Case c;
  c.kernel = SparseMlaKernel::Wgmma;
  c.two_pools = true;
  c.set = SparseMlaCompressed::Selected;
  std::uniform_int_distribution<int> pos(0, 30000);
  for (int i = 0; i < 150; ++i) c.last_pos.push_back(pos(rng()));  // > 132 jobs: CTAs walk several
  run_case(c);
  c.two_pools = false;
  c.last_pos = {9000, 20000, 100};
  c.topk = 2048;
  c.q_scale = 6.0f;
  run_case(c);
  c.topk = 512;
  c.q_scale = 2.0f;
  c.last_pos = {5000, 60, 12000};
  c.graph = true;
  run_case(c);
}

TEST(SparseMlaGpuSanitizer, Small) {
  Case c;
  c.set = SparseMlaCompressed::Selected;
  c.topk = 64;
  c.last_pos = {10, 700};
  c.s_q = {1, 2};
  c.heads_per_cta = 16;
  c.fused_combine = true;
  run_case(c);
  c.fused_combine = false;
  run_case(c);
  c.split = false;
  run_case(c);
  c.split = true;
  c.block_entries = 64;
  c.reference_rounding = true;
  c.match_unsplit = true;
  run_case(c);
  c.block_entries = 0;
  c.reference_rounding = c.match_unsplit = false;
  if (wgmma_here()) {
    c.split = true;
    c.heads_per_cta = 0;
    c.fused_combine = false;
    c.kernel = SparseMlaKernel::Wgmma;
    run_case(c);
  }
}

}  // namespace
}  // namespace dsv4::cuda
