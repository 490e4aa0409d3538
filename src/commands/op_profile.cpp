#include "commands/op_profile.h"

#include <fmt/format.h>

#include <algorithm>

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
        t->calls += s == 0;
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
  std::map<std::string, std::pair<int, double>> kinds;  // layers, ms
  for (const auto& [region, t] : p.regions) {
    auto& k = kinds[region_kind(region, c)];
    k.first += 1, k.second += t.ms;
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

namespace {
double gbs(double bytes, double ms) { return ms > 0 ? bytes / (ms / 1e3) / 1e9 : 0; }
}  // namespace

void print_op_tables(const OpProfile& p, const ModelConfig& c, double copy_gbs, bool flops) {
  fmt::print("### ops (device time of each op alone, per step; % of the op sum; MB = weights + cache + activations)\n\n");
  fmt::print("| op | layers | calls | µs | % | MB | GB/s | % of copy |{}\n|---|---|---:|---:|---:|---:|---:|---:|{}\n",
             flops ? " TFLOP/s |" : "", flops ? "---:|" : "");
  for (const auto& [key, t] : p.ops) {
    const double g = gbs(t.cost.total(), t.ms);
    fmt::print("| {} | {} | {} | {:.1f} | {:.1f} | {:.3f} | {:.0f} | {:.1f} |", key.first, key.second, t.calls, t.ms * 1e3,
               100 * t.ms / p.step_ms, t.cost.total() / 1e6, g, 100 * g / copy_gbs);
    if (flops) fmt::print(" {:.1f} |", t.ms > 0 ? t.cost.flops / (t.ms / 1e3) / 1e12 : 0.0);
    fmt::print("\n");
  }
  fmt::print("\n### layers (op sums; MB = weights + cache)\n\n");
  fmt::print("| layer | kind | ops | µs | MB | GB/s | % of copy |{}\n|---|---|---:|---:|---:|---:|---:|{}\n",
             flops ? " TFLOP/s |" : "", flops ? "---:|" : "");
  for (const auto& [region, t] : p.regions) {
    const double b = t.cost.weights + t.cost.cache, g = gbs(b, t.ms);
    const std::string layer = region < 0 || region >= c.n_layers ? "-" : std::to_string(region);
    fmt::print("| {} | {} | {} | {:.1f} | {:.2f} | {:.0f} | {:.1f} |", layer, region_kind(region, c), t.calls, t.ms * 1e3,
               b / 1e6, g, 100 * g / copy_gbs);
    if (flops) fmt::print(" {:.1f} |", t.ms > 0 ? t.cost.flops / (t.ms / 1e3) / 1e12 : 0.0);
    fmt::print("\n");
  }
  fmt::print("\n");
}

nlohmann::json op_tables_json(const OpProfile& p, const ModelConfig& c) {
  nlohmann::json ops = nlohmann::json::array(), regions = nlohmann::json::array();
  auto cost = [](const OpCost& k) {
    return nlohmann::json{{"bytes_weights", k.weights}, {"bytes_cache", k.cache}, {"bytes_activations", k.activations},
                          {"flops", k.flops}};
  };
  for (const auto& [key, t] : p.ops) {
    nlohmann::json j = {{"op", key.first}, {"layer_kind", key.second}, {"calls", t.calls}, {"us", t.ms * 1e3},
                        {"share", t.ms / p.step_ms}};
    j.update(cost(t.cost));
    ops.push_back(j);
  }
  for (const auto& [region, t] : p.regions) {
    nlohmann::json j = {{"region", region}, {"kind", region_kind(region, c)}, {"calls", t.calls}, {"us", t.ms * 1e3}};
    j.update(cost(t.cost));
    regions.push_back(j);
  }
  nlohmann::json j = {{"op_sum_ms", p.step_ms}, {"ops", ops}, {"regions", regions}};
  j.update(cost(p.step));
  return j;
}

}  // namespace dsv4::commands
