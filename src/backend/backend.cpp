// Backend's defaults and helpers (no backend implementation is linked from here).
#include "backend/backend.h"

#include "core/error.h"

namespace dsv4 {

void Backend::begin_capture() { fail("the {} backend cannot record work for replay", name()); }
std::unique_ptr<CapturedWork> Backend::end_capture() { fail("the {} backend cannot record work for replay", name()); }
void Backend::replay(const CapturedWork&) { fail("the {} backend cannot replay recorded work", name()); }

Tensor upload_i32(Backend& be, const std::vector<int32_t>& values) {
  return be.from_host(DType::I32, {int64_t(values.size())}, values.data());
}

}  // namespace dsv4
