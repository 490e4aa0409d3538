// The step's device-side index work (cuda/step_indices.cu) against its CPU twin
// (cpu/step_indices_reference.h), value for value, on random batches that mix decode rows and
// prefill chunks longer than the window, for every kind and layer ratio; outputs poisoned first.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/step_indices_reference.h"
#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/step_indices.h"
#include "gpu_test_rng.h"

namespace dsv4::cuda {
namespace {

std::mt19937& rng() { return test::fresh_rng("step_indices_gpu_test"); }

constexpr int kWindow = 128, kTopk = 16;

struct Batch {
  std::vector<int32_t> spans, row_span, positions, window, compressed, scratch, topk;
  int64_t rows = 0, S = 0, ww = 0, cw = 0;
};

// Block tables hold distinct random pages, as the pools hand them out.
Batch random_batch(int S, int ratio) {
  Batch b;
  b.S = S;
  std::uniform_int_distribution<int> kind(0, 3), len(2, 300), pos(0, 3000);
  std::vector<int64_t> ends;
  for (int s = 0; s < S; ++s) {
    const int n = kind(rng()) == 0 ? len(rng()) : 1;  // mostly decode rows, some chunks
    const int p0 = pos(rng());
    b.spans.insert(b.spans.end(), {int32_t(b.rows), n, p0});
    for (int i = 0; i < n; ++i) b.row_span.push_back(s), b.positions.push_back(p0 + i);
    b.rows += n;
    ends.push_back(p0 + n);
  }
  b.ww = (kWindow + 63) / 64;
  const int64_t most = *std::max_element(ends.begin(), ends.end());
  b.cw = ratio ? std::max<int64_t>(1, (most / ratio + 63) / 64) : 1;
  std::vector<int32_t> pages(size_t(S * (b.ww + b.cw) + (b.rows + 63) / 64 + 16));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng());
  size_t next = 0;
  for (int64_t i = 0; i < S * b.ww; ++i) b.window.push_back(pages[next++]);
  for (int64_t i = 0; i < S * b.cw; ++i) b.compressed.push_back(pages[next++]);
  for (int64_t i = 0; i < (b.rows + 63) / 64; ++i) b.scratch.push_back(pages[next++]);
  if (b.scratch.empty()) b.scratch.push_back(0);
  b.topk.assign(size_t(b.rows * kTopk), -1);
  for (int64_t r = 0; r < b.rows; ++r) {
    const int have = ratio ? (b.positions[size_t(r)] + 1) / ratio : 0;
    for (int k = 0; k < std::min(have, kTopk); ++k) b.topk[size_t(r * kTopk + k)] = int32_t(rng()() % unsigned(have));
  }
  return b;
}

// A description of `kind` over b, without its arrays.
cpu::StepIndexArrays describe(const Batch& b, StepIndexKind kind, int ratio) {
  cpu::StepIndexArrays a;
  a.kind = kind;
  a.rows = b.rows;
  a.spans = b.S;
  a.window_width = b.ww;
  a.compressed_width = b.cw;
  a.ratio = ratio;
  a.window_size = kWindow;
  int64_t most = 0, completed = 0;
  for (int64_t s = 0; s < b.S; ++s) {
    const int64_t n = b.spans[size_t(s * 3 + 1)], p0 = b.spans[size_t(s * 3 + 2)];
    most = std::max(most, p0 + n);
    if (ratio) completed += (p0 + n) / ratio - p0 / ratio;
  }
  if (kind == StepIndexKind::AttentionLists) a.count = ratio == 4 ? kTopk : ratio == 128 ? most / 128 : 0;
  else a.count = completed;
  return a;
}

// The kinds run in one launch (one kind: the single-description call), each output poisoned first
// and compared value for value with the reference.
void check(const Batch& b, const std::vector<StepIndexKind>& kinds, int ratio) {
  DeviceBuffer<int32_t> sp(b.spans.size()), rs(b.row_span.size()), ps(b.positions.size()), wn(b.window.size()),
      cm(b.compressed.size()), sc(b.scratch.size()), tk(b.topk.size());
  Stream stream;
  sp.upload(b.spans, stream.get()), rs.upload(b.row_span, stream.get()), ps.upload(b.positions, stream.get());
  wn.upload(b.window, stream.get()), cm.upload(b.compressed, stream.get()), sc.upload(b.scratch, stream.get());
  tk.upload(b.topk, stream.get());
  std::vector<cpu::StepIndexArrays> d;
  std::vector<std::vector<int32_t>> want;
  std::vector<DeviceBuffer<int32_t>> out;
  for (StepIndexKind kind : kinds) {
    const cpu::StepIndexArrays a = describe(b, kind, ratio);
    cpu::StepIndexArrays h = a;
    h.span_table = b.spans.data(), h.row_span = b.row_span.data(), h.positions = b.positions.data();
    h.window = b.window.data(), h.compressed = b.compressed.data(), h.scratch = b.scratch.data(), h.topk = b.topk.data();
    const int64_t size = cpu::step_indices_size(h);
    want.emplace_back(size_t(size), 0x7eadbeef);
    cpu::step_indices_reference(h, want.back().data());
    out.emplace_back(size_t(std::max<int64_t>(size, 1)));
    DSV4_CUDA_CHECK(cudaMemsetAsync(out.back().get(), 0x5a, out.back().bytes(), stream.get()));  // poison
    d.push_back(a);
    cpu::StepIndexArrays& dev = d.back();
    dev.span_table = sp.get(), dev.row_span = rs.get(), dev.positions = ps.get();
    dev.window = wn.get(), dev.compressed = cm.get(), dev.scratch = sc.get(), dev.topk = tk.get();
  }
  if (kinds.size() == 1) {
    step_indices(d[0], out[0].get(), stream.get());
  } else {
    std::vector<int32_t*> ptrs;
    for (auto& o : out) ptrs.push_back(o.get());
    step_indices(d.data(), ptrs.data(), int(d.size()), stream.get());
  }
  for (size_t k = 0; k < kinds.size(); ++k) {
    std::vector<int32_t> got = out[k].download(stream.get());
    got.resize(want[k].size());
    int64_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[k][i];
    EXPECT_EQ(bad, 0) << "kind " << int(kinds[k]) << " (" << k + 1 << " of " << kinds.size() << " in the launch) ratio "
                      << ratio << ": " << bad << " of " << got.size() << " values differ";
  }
}

void check(const Batch& b, StepIndexKind kind, int ratio) { check(b, std::vector<StepIndexKind>{kind}, ratio); }

TEST(StepIndicesGpu, EveryKindMatchesTheReference) {
  for (int ratio : {0, 4, 128})
    for (int S : {1, 3, 17, 64})
      for (int rep = 0; rep < 3; ++rep) {
        const Batch b = random_batch(S, ratio);
        check(b, StepIndexKind::NewEntries, ratio);
        check(b, StepIndexKind::RingSlots, ratio);
        check(b, StepIndexKind::AttentionLists, ratio);
        if (ratio) {
          check(b, StepIndexKind::CompressedEntries, ratio);
          check(b, StepIndexKind::CompressedPositions, ratio);
          check(b, StepIndexKind::KeyCounts, ratio);
        }
      }
}

// A layer's tables in one launch, as the model asks for them: sizes from a handful of values to
// thousands, every description's output its own.
TEST(StepIndicesGpu, SeveralDescriptionsInOneLaunch) {
  for (int ratio : {0, 4, 128})
    for (int S : {1, 5, 64})
      for (int rep = 0; rep < 2; ++rep) {
        const Batch b = random_batch(S, ratio);
        check(b, {StepIndexKind::NewEntries, StepIndexKind::RingSlots, StepIndexKind::AttentionLists}, ratio);
        if (ratio) {
          check(b, {StepIndexKind::NewEntries, StepIndexKind::RingSlots, StepIndexKind::KeyCounts}, ratio);
          check(b, {StepIndexKind::CompressedPositions, StepIndexKind::CompressedEntries}, ratio);
          check(b, {StepIndexKind::CompressedEntries, StepIndexKind::NewEntries, StepIndexKind::AttentionLists,
                    StepIndexKind::RingSlots}, ratio);
        }
      }
}

}  // namespace
}  // namespace dsv4::cuda
