// Weights generated on the GPU (backend/cuda/random_fill.cu) against random_fill_reference, the
// host's bytes for the same fill: every kind, fresh streams and parameters, bit for bit, the
// output poisoned beforehand and nothing written past it.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/random_fill.h"
#include "backend/random_fill.h"
#include "gpu_test_rng.h"

namespace dsv4::cuda {
namespace {

std::mt19937& rng() { return test::fresh_rng("random_fill_gpu_test"); }

void check_fill(RandomFill f, int64_t n) {
  const size_t bytes = size_t(n) * size_t(random_fill_element_bytes(f.kind)), tail = 64;
  std::vector<uint8_t> want(bytes);
  random_fill_reference(f, want.data(), n);
  Stream stream;
  DeviceBuffer<uint8_t> out(bytes + tail);
  out.fill_bytes(0xa5, stream.get());
  random_fill(f, out.get(), n, stream.get());
  const std::vector<uint8_t> got = out.download(stream.get());
  size_t differ = 0, past = 0;
  for (size_t i = 0; i < bytes; ++i) differ += got[i] != want[i];
  for (size_t i = bytes; i < got.size(); ++i) past += got[i] != 0xa5;
  std::printf("fill kind %d, %lld elements (mean %g, amp %g): %zu bytes differ, %zu written past the end\n", int(f.kind),
              (long long)n, f.mean, f.amp, differ, past);
  EXPECT_EQ(differ, 0u);
  EXPECT_EQ(past, 0u);
}

TEST(RandomFill, GpuBytesAreTheHostBytes) {
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (auto kind : {RandomFill::Kind::Bf16Uniform, RandomFill::Kind::F32Uniform, RandomFill::Kind::Fp8Weight,
                    RandomFill::Kind::Bytes, RandomFill::Kind::Constant}) {
    for (int64_t n : {int64_t(1), int64_t(1000), int64_t(17 << 20) + 37}) {  // past the grid's 2^16 blocks: strided
      RandomFill f;
      f.kind = kind;
      f.stream = (uint64_t(rng()()) << 32) | rng()();
      f.mean = u(rng()), f.amp = u(rng());
      f.byte = uint8_t(rng()());
      check_fill(f, n);
    }
  }
}

// A window (a tensor-parallel rank's slice, RandomFill::cols …) is the slice of the whole fill, on
// the host and on the GPU.
TEST(RandomFill, WindowIsTheSliceOfTheWholeTensor) {
  for (auto kind : {RandomFill::Kind::Bf16Uniform, RandomFill::Kind::Fp8Weight, RandomFill::Kind::Bytes}) {
    const int64_t rows = 1 + rng()() % 300, cols = 1 + rng()() % 700;
    const int64_t r0 = rng()() % rows, nr = 1 + rng()() % (rows - r0), c0 = rng()() % cols, nc = 1 + rng()() % (cols - c0);
    const int es = random_fill_element_bytes(kind);
    RandomFill f;
    f.kind = kind;
    f.stream = (uint64_t(rng()()) << 32) | rng()();
    f.amp = 0.5f;
    std::vector<uint8_t> whole(size_t(rows * cols * es));
    random_fill_reference(f, whole.data(), rows * cols);
    std::vector<uint8_t> slice(size_t(nr * nc * es));
    for (int64_t r = 0; r < nr; ++r)
      std::memcpy(slice.data() + r * nc * es, whole.data() + ((r0 + r) * cols + c0) * es, size_t(nc * es));
    f.cols = nc, f.source_cols = cols, f.row0 = r0, f.col0 = c0;
    std::vector<uint8_t> host(slice.size());
    random_fill_reference(f, host.data(), nr * nc);
    EXPECT_EQ(host, slice) << "host window, kind " << int(kind);
    check_fill(f, nr * nc);  // the GPU's window against the host's
  }
}

}  // namespace
}  // namespace dsv4::cuda
