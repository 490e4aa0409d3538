// Backend's defaults and helpers (no backend implementation is linked from here).
#include "backend/backend.h"

#include <chrono>

#include "core/error.h"

namespace dsv4 {

void Backend::begin_capture() { fail("the {} backend cannot record work for replay", name()); }
std::unique_ptr<CapturedWork> Backend::end_capture() { fail("the {} backend cannot record work for replay", name()); }
void Backend::replay(const CapturedWork&) { fail("the {} backend cannot replay recorded work", name()); }

int Backend::mark() {
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  host_marks_ms_.push_back(std::chrono::duration<double, std::milli>(now).count());
  return int(host_marks_ms_.size()) - 1;
}
double Backend::elapsed_ms(int from, int to) { return host_marks_ms_.at(size_t(to)) - host_marks_ms_.at(size_t(from)); }
void Backend::clear_marks() { host_marks_ms_.clear(); }

Tensor upload_i32(Backend& be, const std::vector<int32_t>& values) {
  return be.from_host(DType::I32, {int64_t(values.size())}, values.data());
}

}  // namespace dsv4
