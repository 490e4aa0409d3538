#include "commands/op_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace dsv4::commands {

std::string region_kind(int region, const ModelConfig& c) {
  if (region < 0) return "embed";
  if (region >= c.n_layers) return "head";
  const int ratio = c.compress_ratios[size_t(region)];
  return ratio == 0 ? "SWA" : ratio == 4 ? "CSA" : "HCA";
}

OpProfile summarise_ops(const std::vector<std::vector<ProfilingBackend::OpRecord>>& steps, const ModelConfig& c) {
  OpProfile p;
  std::map<std::pair<std::string, std::string>, OpTotal> by_op;
  const double per = 1.0 / double(std::max<size_t>(steps.size(), 1));
  for (size_t s = 0; s < steps.size(); ++s)
    for (const auto& r : steps[s]) {
      for (OpTotal* t : {&by_op[{r.op, region_kind(r.region, c)}], &p.regions[r.region]}) {
        t->ms += r.ms * per;
        t->cost.add(r.cost, per);
        t->calls += s == 0 && !r.continues;
      }
      p.step_ms += r.ms * per;
      p.step.add(r.cost, per);
    }
  p.ops.assign(by_op.begin(), by_op.end());
  std::sort(p.ops.begin(), p.ops.end(), [](const auto& x, const auto& y) { return x.second.ms > y.second.ms; });
  return p;
}

double FlashProjection::op_sum_ms() const { return kSwa * swa_ms + kCsa * csa_ms + kHca * hca_ms + embed_ms + head_ms; }

FlashProjection project_flash(const OpProfile& p, const ModelConfig& c) {
  std::map<int, double> ms;
  for (const auto& [region, t] : p.regions) ms[region] = t.ms;
  return project_flash(ms, c);
}

FlashProjection project_flash(const ReplayView& v, const ModelConfig& c) {
  std::map<int, double> ms;
  for (const auto& [region, us] : v.region_us) ms[region] = us / 1e3;
  return project_flash(ms, c);
}

FlashProjection project_flash(const std::map<int, double>& region_ms, const ModelConfig& c) {
  std::map<std::string, std::pair<int, double>> kinds;  // layers, ms
  for (const auto& [region, ms] : region_ms) {
    auto& k = kinds[region_kind(region, c)];
    k.first += 1, k.second += ms;
  }
  auto mean = [&](const char* k) {
    auto it = kinds.find(k);
    return it == kinds.end() ? -1.0 : it->second.second / it->second.first;
  };
  FlashProjection f;
  f.swa_ms = mean("SWA"), f.csa_ms = mean("CSA"), f.hca_ms = mean("HCA");
  f.embed_ms = std::max(mean("embed"), 0.0), f.head_ms = std::max(mean("head"), 0.0);
  f.valid = f.swa_ms >= 0 && f.csa_ms >= 0 && f.hca_ms >= 0;
  return f;
}

double flash_step_bytes(const OpProfile& p, const ModelConfig& c) {
  std::map<int, double> bytes;
  for (const auto& [region, t] : p.regions) bytes[region] = t.cost.weights + t.cost.cache;
  const FlashProjection f = project_flash(bytes, c);  // the schedule's sum, of bytes instead of ms
  return f.valid ? f.op_sum_ms() : 0;
}

namespace {
// The op call that made each item (null for none): op calls cover disjoint item ranges.
class OpOfItem {
 public:
  explicit OpOfItem(const std::vector<ProfilingBackend::RecordedOp>& ops) : ops_(ops) {
    for (size_t i = 0; i < ops.size(); ++i)
      if (ops[i].to > ops[i].from) first_[ops[i].from] = i;
  }
  const ProfilingBackend::RecordedOp* operator()(int64_t item) const {
    auto it = first_.upper_bound(item);
    if (it == first_.begin()) return nullptr;
    const auto& op = ops_[std::prev(it)->second];
    return item < op.to ? &op : nullptr;
  }

 private:
  const std::vector<ProfilingBackend::RecordedOp>& ops_;
  std::map<int64_t, size_t> first_;
};
}  // namespace

ReplayView replay_view(const std::vector<std::vector<CapturedWork::TracedItem>>& replays,
                       const std::vector<ProfilingBackend::RecordedOp>& ops, const ModelConfig& c) {
  ReplayView v;
  if (replays.empty()) return v;
  v.traced = true;
  v.replays = int(replays.size());
  const OpOfItem op_of(ops);
  const double per = 1.0 / double(replays.size());
  std::map<std::string, ReplayView::Kernel> kernels;
  for (size_t r = 0; r < replays.size(); ++r) {
    std::vector<CapturedWork::TracedItem> items = replays[r];
    if (items.empty()) continue;
    double front = items.front().start_us, last = front;
    for (const auto& it : items) front = std::min(front, it.start_us), last = std::max(last, it.end_us);
    v.step_us += (last - front) * per;
    std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.end_us < b.end_us; });
    for (const auto& it : items) {
      const double share = std::max(0.0, it.end_us - front);
      front = std::max(front, it.end_us);
      ReplayView::Kernel& k = kernels[it.name];
      k.name = it.name, k.us += share * per, k.busy_us += (it.end_us - it.start_us) * per, k.calls += r == 0;
      if (const auto* op = op_of(it.item)) {
        v.op_us[{op->op, region_kind(op->region, c)}] += share * per;
        v.op_region_us[{op->op, op->region}] += share * per;
        v.region_us[op->region] += share * per;
      } else {
        v.unattributed_us += share * per;
      }
    }
  }
  for (auto& [name, k] : kernels) v.kernels.push_back(k);
  std::sort(v.kernels.begin(), v.kernels.end(), [](const auto& a, const auto& b) { return a.us > b.us; });
  return v;
}

void write_chrome_trace(const std::string& path, const std::vector<CapturedWork::TracedItem>& replay,
                        const std::vector<ProfilingBackend::RecordedOp>& ops, const ModelConfig& c) {
  std::vector<CapturedWork::TracedItem> items = replay;
  std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.start_us < b.start_us; });
  const double origin = items.empty() ? 0 : items.front().start_us;
  const OpOfItem op_of(ops);
  std::vector<double> row_end;  // the last end on each row
  nlohmann::json events = nlohmann::json::array();
  for (const auto& it : items) {
    size_t row = 0;
    while (row < row_end.size() && row_end[row] > it.start_us) ++row;
    if (row == row_end.size()) row_end.push_back(0);
    row_end[row] = it.end_us;
    const auto* op = op_of(it.item);
    nlohmann::json args = {{"item", it.item}};
    if (op) args["op"] = op->op, args["layer"] = op->region, args["kind"] = region_kind(op->region, c);
    events.push_back({{"name", it.name}, {"cat", op ? op->op : "(no op)"}, {"ph", "X"}, {"ts", it.start_us - origin},
                      {"dur", it.end_us - it.start_us}, {"pid", 0}, {"tid", row}, {"args", args}});
  }
  std::ofstream f(path);
  if (!f) fail("--trace {}: cannot write the file", path);
  f << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ns"}}.dump() << "\n";
  if (!f) fail("--trace {}: writing failed", path);
}

double RegionSplit::overlapped_us(double copy_gbs) const {
  return std::max(stretch_us, copy_gbs > 0 ? bytes / copy_gbs / 1e3 : 0.0);
}

std::map<int, RegionSplit> split_regions(const OpProfile& p, const ReplayView& v, const ModelConfig& c) {
  std::map<std::pair<std::string, std::string>, bool> streams;  // (op, kind) → weights a call ≥ kStreamingOpBytes
  for (const auto& [key, t] : p.ops) streams[key] = t.calls > 0 && t.cost.weights / t.calls >= kStreamingOpBytes;
  std::map<int, RegionSplit> split;
  for (const auto& [region, t] : p.regions) split[region].bytes = t.cost.weights + t.cost.cache;
  for (const auto& [key, us] : v.op_region_us) {
    const auto it = streams.find({key.first, region_kind(key.second, c)});
    RegionSplit& s = split[key.second];
    (it != streams.end() && it->second ? s.streaming_us : s.stretch_us) += us;
  }
  return split;
}

FlashProjection project_flash_overlapped(const std::map<int, RegionSplit>& split, double copy_gbs, const ModelConfig& c) {
  std::map<int, double> ms;
  for (const auto& [region, s] : split) ms[region] = s.overlapped_us(copy_gbs) / 1e3;
  return project_flash(ms, c);
}

void print_replay_kernels(const ReplayView& v, int top) {
  fmt::print("### the traced replay by kernel (µs of the replayed step each moved its end; busy = start to end, a "
             "programmatic launch starting early and waiting)\n\n| kernel | calls | µs | % | busy µs |\n|---|---:|---:|---:|---:|\n");
  for (size_t i = 0; i < v.kernels.size() && int(i) < top; ++i) {
    const auto& k = v.kernels[i];
    fmt::print("| {} | {} | {:.1f} | {:.1f} | {:.1f} |\n", k.name, k.calls, k.us, 100 * k.us / v.step_us, k.busy_us);
  }
  if (v.kernels.size() > size_t(top)) {
    double rest = 0;
    for (size_t i = size_t(top); i < v.kernels.size(); ++i) rest += v.kernels[i].us;
    fmt::print("| ({} more) | | {:.1f} | {:.1f} | |\n", v.kernels.size() - size_t(top), rest, 100 * rest / v.step_us);
  }
  fmt::print("\n");
}

nlohmann::json replay_view_json(const ReplayView& v) {
  if (!v.traced) return nlohmann::json{{"traced", false}, {"why_not", v.why_not}};
  nlohmann::json kernels = nlohmann::json::array();
  for (const auto& k : v.kernels) kernels.push_back({{"name", k.name}, {"calls", k.calls}, {"us", k.us}, {"busy_us", k.busy_us}});
  return {{"traced", true}, {"replays", v.replays}, {"step_us", v.step_us}, {"unattributed_us", v.unattributed_us},
          {"kernels", kernels}};
}

namespace {
double gbs(double bytes, double ms) { return ms > 0 ? bytes / (ms / 1e3) / 1e9 : 0; }
double at(const std::map<std::pair<std::string, std::string>, double>& m, const std::pair<std::string, std::string>& k) {
  auto it = m.find(k);
  return it == m.end() ? 0 : it->second;
}
}  // namespace

void print_op_tables(const OpProfile& p, const ModelConfig& c, double copy_gbs, bool flops, const ReplayView* replay) {
  const bool rp = replay && replay->traced;
  fmt::print("### ops (device time of each op alone, per step; % of the op sum; MB = weights + cache + activations{})\n\n",
             rp ? "; replayed: µs of the traced replayed step, % of it" : "");
  fmt::print("| op | layers | calls | µs | % | MB | GB/s | % of copy |{}{}\n|---|---|---:|---:|---:|---:|---:|---:|{}{}\n",
             flops ? " TFLOP/s |" : "", rp ? " replayed µs | replayed % |" : "", flops ? "---:|" : "", rp ? "---:|---:|" : "");
  for (const auto& [key, t] : p.ops) {
    const double g = gbs(t.cost.total(), t.ms);
    fmt::print("| {} | {} | {} | {:.1f} | {:.1f} | {:.3f} | {:.0f} | {:.1f} |", key.first, key.second, t.calls, t.ms * 1e3,
               100 * t.ms / p.step_ms, t.cost.total() / 1e6, g, 100 * g / copy_gbs);
    if (flops) fmt::print(" {:.1f} |", t.ms > 0 ? t.cost.flops / (t.ms / 1e3) / 1e12 : 0.0);
    if (rp) {
      const double us = at(replay->op_us, key);
      fmt::print(" {:.1f} | {:.1f} |", us, 100 * us / replay->step_us);
    }
    fmt::print("\n");
  }
  if (rp && replay->unattributed_us > 0)
    fmt::print("| (items no op made) | | | | | | | |{} {:.1f} | {:.1f} |\n", flops ? " |" : "", replay->unattributed_us,
               100 * replay->unattributed_us / replay->step_us);
  fmt::print("\n### layers (op sums; MB = weights + cache{})\n\n",
             rp ? "; replayed: as above, and its bytes over it; of which streaming: the shares of ops reading ≥ 4 MB of "
                  "weights a call, stretches: the rest (HBM mostly idle); overlapped: max(stretches, MB at the copy "
                  "bandwidth), a form that read the weights during the stretches"
                : "");
  fmt::print("| layer | kind | ops | µs | MB | GB/s | % of copy |{}{}\n|---|---|---:|---:|---:|---:|---:|{}{}\n",
             flops ? " TFLOP/s |" : "",
             rp ? " replayed µs | replayed % of copy | streaming µs | stretches µs | overlapped µs |" : "",
             flops ? "---:|" : "", rp ? "---:|---:|---:|---:|---:|" : "");
  const std::map<int, RegionSplit> split = rp ? split_regions(p, *replay, c) : std::map<int, RegionSplit>{};
  for (const auto& [region, t] : p.regions) {
    const double b = t.cost.weights + t.cost.cache, g = gbs(b, t.ms);
    const std::string layer = region < 0 || region >= c.n_layers ? "-" : std::to_string(region);
    fmt::print("| {} | {} | {} | {:.1f} | {:.2f} | {:.0f} | {:.1f} |", layer, region_kind(region, c), t.calls, t.ms * 1e3,
               b / 1e6, g, 100 * g / copy_gbs);
    if (flops) fmt::print(" {:.1f} |", t.ms > 0 ? t.cost.flops / (t.ms / 1e3) / 1e12 : 0.0);
    if (rp) {
      auto it = replay->region_us.find(region);
      const double us = it == replay->region_us.end() ? 0 : it->second;
      fmt::print(" {:.1f} | {:.1f} |", us, 100 * gbs(b, us / 1e3) / copy_gbs);
      const auto s = split.find(region);
      const RegionSplit r = s == split.end() ? RegionSplit{} : s->second;
      fmt::print(" {:.1f} | {:.1f} | {:.1f} |", r.streaming_us, r.stretch_us, r.overlapped_us(copy_gbs));
    }
    fmt::print("\n");
  }
  fmt::print("\n");
}

nlohmann::json op_tables_json(const OpProfile& p, const ModelConfig& c, const ReplayView* replay) {
  const bool rp = replay && replay->traced;
  const std::map<int, RegionSplit> split = rp ? split_regions(p, *replay, c) : std::map<int, RegionSplit>{};
  nlohmann::json ops = nlohmann::json::array(), regions = nlohmann::json::array();
  auto cost = [](const OpCost& k) {
    return nlohmann::json{{"bytes_weights", k.weights}, {"bytes_cache", k.cache}, {"bytes_activations", k.activations},
                          {"flops", k.flops}};
  };
  for (const auto& [key, t] : p.ops) {
    nlohmann::json j = {{"op", key.first}, {"layer_kind", key.second}, {"calls", t.calls}, {"us", t.ms * 1e3},
                        {"share", t.ms / p.step_ms}};
    if (rp) j["replayed_us"] = at(replay->op_us, key);
    j.update(cost(t.cost));
    ops.push_back(j);
  }
  for (const auto& [region, t] : p.regions) {
    nlohmann::json j = {{"region", region}, {"kind", region_kind(region, c)}, {"calls", t.calls}, {"us", t.ms * 1e3}};
    if (rp) {
      j["replayed_us"] = replay->region_us.count(region) ? replay->region_us.at(region) : 0.0;
      const auto s = split.find(region);
      j["replayed_streaming_us"] = s == split.end() ? 0.0 : s->second.streaming_us;
      j["replayed_stretch_us"] = s == split.end() ? 0.0 : s->second.stretch_us;
    }
    j.update(cost(t.cost));
    regions.push_back(j);
  }
  nlohmann::json j = {{"op_sum_ms", p.step_ms}, {"ops", ops}, {"regions", regions}};
  j.update(cost(p.step));
  return j;
}

}  // namespace dsv4::commands
