// Backend's defaults and helpers (no backend implementation is linked from here).
#include "backend/backend.h"

#include <chrono>

#include "core/error.h"

namespace dsv4 {

void Backend::begin_capture() { fail("the {} backend cannot record work for replay", name()); }
std::unique_ptr<CapturedWork> Backend::end_capture() { fail("the {} backend cannot record work for replay", name()); }
void Backend::replay(const CapturedWork&) { fail("the {} backend cannot replay recorded work", name()); }
std::vector<std::vector<CapturedWork::TracedItem>> Backend::trace_replays(const CapturedWork&, int, std::string& why_not) {
  why_not = fmt::format("the {} backend does not trace its replays", name());
  return {};
}

void Backend::norm_rope(Tensor& x, int head_dim, const uint16_t* weight, float eps, int rope_dim,
                        const Tensor& positions, const RopeTable& table, bool fp8_nope) {
  Tensor heads = x;
  heads.shape = {x.numel() / head_dim, head_dim};
  const Tensor y = rms_norm(heads, weight, eps);
  copy_rows(y, 0, heads, 0, heads.shape[0]);
  rope(x, head_dim, rope_dim, positions, table, false);
  if (fp8_nope) fp8_simulate(x, head_dim, head_dim - rope_dim);
}

void Backend::head_norm_rope(Tensor& x, int head_dim, float eps, int rope_dim, const Tensor& positions,
                             const RopeTable& table) {
  head_rms_norm(x, head_dim, eps);
  rope(x, head_dim, rope_dim, positions, table, false);
}

Tensor Backend::hc_post_pre(const Tensor& y, const Tensor& X, Tensor* Xa, const HyperConnection& hc, int hc_mult,
                            int iters, float norm_eps, float hc_eps, Tensor* post, Tensor* comb, const uint16_t* norm) {
  *Xa = hc_post(y, X, *post, *comb);
  return hc_pre(*Xa, hc, hc_mult, iters, norm_eps, hc_eps, post, comb, norm);
}

std::vector<Tensor> Backend::linears(const Tensor& x, const std::vector<const LinearWeight*>& ws) {
  std::vector<Tensor> out;
  out.reserve(ws.size());
  for (const LinearWeight* w : ws) out.push_back(linear(x, *w));
  return out;
}

std::vector<Tensor> Backend::linears_f32(const Tensor& x, const std::vector<std::pair<const uint16_t*, int>>& ws,
                                         int in) {
  std::vector<Tensor> out;
  out.reserve(ws.size());
  for (const auto& [w, n] : ws) out.push_back(linear_f32(x, w, n, in));
  return out;
}

std::vector<Tensor> Backend::step_index_sets(const std::vector<StepIndexArgs>& sets) {
  std::vector<Tensor> out;
  out.reserve(sets.size());
  for (const StepIndexArgs& a : sets) out.push_back(step_indices(a));
  return out;
}

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
