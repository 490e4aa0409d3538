#include "backend/random_fill.h"

#include <cstring>

#include "core/dtypes.h"
#include "core/thread_pool.h"

namespace dsv4 {

int random_fill_element_bytes(RandomFill::Kind kind) {
  switch (kind) {
    case RandomFill::Kind::Bf16Uniform: return 2;
    case RandomFill::Kind::F32Uniform: return 4;
    default: return 1;
  }
}

void random_fill_reference(const RandomFill& f, void* dst, int64_t n) {
  if (f.kind == RandomFill::Kind::Constant) {
    std::memset(dst, f.byte, size_t(n));
    return;
  }
  auto fill = [&](auto&& value_of) {
    parallel_for(n, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) value_of(i, random_fill_number(f, i));
    });
  };
  // The product is rounded before the sum (volatile: no contraction into an FMA), as the device does.
  switch (f.kind) {
    case RandomFill::Kind::Bf16Uniform: {
      auto* p = static_cast<uint16_t*>(dst);
      fill([&](int64_t i, uint64_t r) {
        const volatile float scaled = f.amp * random_unit(r);
        p[i] = f32_to_bf16(f.mean + scaled);
      });
      break;
    }
    case RandomFill::Kind::F32Uniform: {
      auto* p = static_cast<float*>(dst);
      fill([&](int64_t i, uint64_t r) {
        const volatile float scaled = f.amp * random_unit(r);
        p[i] = f.mean + scaled;
      });
      break;
    }
    case RandomFill::Kind::Fp8Weight: {
      auto* p = static_cast<uint8_t*>(dst);
      fill([&](int64_t i, uint64_t r) { p[i] = uint8_t((r & 0x87) | (((r >> 3) & 3) + 5) << 3); });
      break;
    }
    case RandomFill::Kind::Bytes: {
      auto* p = static_cast<uint8_t*>(dst);
      fill([&](int64_t i, uint64_t r) { p[i] = uint8_t(r); });
      break;
    }
    case RandomFill::Kind::Constant: break;
  }
}

}  // namespace dsv4
