// Quantise-on-write kernels of the paged caches against the host codecs of kv_cache_layout.h,
// byte for byte, including entries skipped (id −1) and untouched neighbours.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/cuda_utils.h"
#include "backend/cuda/kv_cache.h"
#include "backend/kv_cache_layout.h"
#include "core/dtypes.h"
#include "gpu_test_rng.h"

namespace dsv4::cuda {
namespace {

namespace kl = dsv4::kv_layout;

std::mt19937& rng() { return test::fresh_rng("kv_cache_gpu_test"); }

// Rows of bf16 values with per-block magnitudes from 2^-30 (under the amax floors) to 2^12, some zero.
std::vector<uint16_t> random_rows(int n, int width, int block) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> e(-30, 12);
  std::vector<uint16_t> v(size_t(n) * width);
  for (int r = 0; r < n; ++r)
    for (int b = 0; b < width / block; ++b) {
      const float mag = (r + b) % 13 == 0 ? 0.f : std::ldexp(1.0f, e(rng()));
      for (int i = 0; i < block; ++i) v[size_t(r) * width + b * block + i] = f32_to_bf16(nd(rng()) * mag);
    }
  return v;
}

enum class Kind { Kv, IndexFp4, IndexFp8 };

void run_case(Kind kind, int n, int pages) {
  const int width = kind == Kind::Kv ? 512 : 128;
  const size_t page_bytes = kind == Kind::Kv ? kl::kKvPageBytes
                            : kind == Kind::IndexFp4 ? kl::kIndexFp4PageBytes : kl::kIndexFp8PageBytes;
  std::vector<uint16_t> values = random_rows(n, width, kind == Kind::IndexFp4 ? 32 : 64);
  std::vector<int32_t> all(pages * kl::kEntriesPerPage);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng());
  std::vector<int32_t> ids(all.begin(), all.begin() + n);
  for (int i = 0; i < n; i += 17) ids[i] = -1;
  std::vector<uint8_t> want(size_t(pages) * page_bytes);
  for (size_t i = 0; i < want.size(); ++i) want[i] = uint8_t(i * 131 + 7);
  std::vector<float> row(width);
  for (int r = 0; r < n; ++r) {
    if (ids[r] < 0) continue;
    for (int i = 0; i < width; ++i) row[i] = bf16_to_f32(values[size_t(r) * width + i]);
    const int64_t g = ids[r];
    if (kind == Kind::Kv) {
      kl::encode_kv_entry_at(want.data(), g, row.data());
    } else if (kind == Kind::IndexFp4) {
      kl::encode_index_key_fp4_at(want.data(), g, row.data());
    } else {
      float s;
      kl::encode_index_key_fp8(row.data(), want.data() + kl::index_fp8_data_offset(g), &s);
      std::memcpy(want.data() + kl::index_fp8_scale_offset(g), &s, 4);
    }
  }
  Stream stream;
  DeviceBuffer<uint8_t> pool(want.size());
  std::vector<uint8_t> init(want.size());
  for (size_t i = 0; i < init.size(); ++i) init[i] = uint8_t(i * 131 + 7);
  pool.upload(init, stream.get());
  DeviceBuffer<__nv_bfloat16> d_values(values.size());
  d_values.upload(reinterpret_cast<const __nv_bfloat16*>(values.data()), values.size(), stream.get());
  DeviceBuffer<int32_t> d_ids(n);
  d_ids.upload(ids, stream.get());
  if (kind == Kind::Kv) append_kv_entries(d_values.get(), d_ids.get(), n, pool.get(), stream.get());
  if (kind == Kind::IndexFp4) append_index_keys_fp4(d_values.get(), d_ids.get(), n, pool.get(), stream.get());
  if (kind == Kind::IndexFp8) append_index_keys_fp8(d_values.get(), d_ids.get(), n, pool.get(), stream.get());
  std::vector<uint8_t> got = pool.download(stream.get());
  size_t diff = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && diff++ == 0) first = i;
  EXPECT_EQ(diff, 0u) << "first differing byte " << first << " (page " << first / page_bytes << ", offset "
                      << first % page_bytes << ")";
}

// copy_kv_entries (the window ring's update) against memmove of the entries' data and scale bytes
// on the host: random bytes in the pool, disjoint source and destination sets, some −1 pairs.
void run_copy_case(int n, int pages) {
  std::vector<uint8_t> init(size_t(pages) * kl::kKvPageBytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : init) b = uint8_t(byte(rng()));
  std::vector<int32_t> all(pages * kl::kEntriesPerPage);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng());
  std::vector<int32_t> src(all.begin(), all.begin() + n), dst(all.begin() + n, all.begin() + 2 * n);
  for (int i = 3; i < n; i += 11) (i % 2 ? src : dst)[i] = -1;
  std::vector<uint8_t> want = init;
  for (int i = 0; i < n; ++i) {
    if (src[i] < 0 || dst[i] < 0) continue;
    std::memcpy(want.data() + kl::kv_entry_data_offset(dst[i]), init.data() + kl::kv_entry_data_offset(src[i]),
                kl::kEntryDataBytes);
    std::memcpy(want.data() + kl::kv_entry_scale_offset(dst[i]), init.data() + kl::kv_entry_scale_offset(src[i]),
                kl::kEntryScaleBytes);
  }
  Stream stream;
  DeviceBuffer<uint8_t> pool(init.size());
  pool.upload(init, stream.get());
  DeviceBuffer<int32_t> d_src(n), d_dst(n);
  d_src.upload(src, stream.get());
  d_dst.upload(dst, stream.get());
  copy_kv_entries(d_src.get(), d_dst.get(), n, pool.get(), stream.get());
  std::vector<uint8_t> got = pool.download(stream.get());
  size_t diff = 0;
  for (size_t i = 0; i < got.size(); ++i) diff += got[i] != want[i];
  std::printf("copy_kv_entries %d entries over %d pages: %zu bytes differ\n", n, pages, diff);
  EXPECT_EQ(diff, 0u);
}

TEST(KvCacheGpu, KvEntriesMatchHostEncoder) { run_case(Kind::Kv, 1000, 20); }
TEST(KvCacheGpu, CopyEntriesMatchesHostCopy) { run_copy_case(128, 6); run_copy_case(700, 30); }
TEST(KvCacheGpu, IndexKeysFp4MatchHostEncoder) { run_case(Kind::IndexFp4, 3000, 50); }
TEST(KvCacheGpu, IndexKeysFp8MatchHostEncoder) { run_case(Kind::IndexFp8, 3000, 50); }
TEST(KvCacheGpuSanitizer, Small) {
  run_case(Kind::Kv, 40, 2);
  run_case(Kind::IndexFp4, 40, 2);
  run_case(Kind::IndexFp8, 40, 2);
  run_copy_case(20, 2);
}

}  // namespace
}  // namespace dsv4::cuda
