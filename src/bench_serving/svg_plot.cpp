#include "bench_serving/svg_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace dsv4::bench_serving {

double nice_step(double max, int max_ticks) {
  if (!(max > 0)) return 1;
  const double raw = max / max_ticks, magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * magnitude >= raw) return m * magnitude;
  return 10 * magnitude;
}

namespace {

std::string escape_xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string number(double v) {
  if (v >= 100 || v == std::floor(v)) return fmt::format("{:.0f}", v);
  return fmt::format("{:.3g}", v);
}

}  // namespace

std::string sweep_svg(const std::string& title, const std::vector<SweepPoint>& points) {
  const double width = 720, height = 420, left = 80, right = 80, top = 50, bottom = 60;
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  double max_tput = 0, max_tpot = 0;
  for (auto& p : points) max_tput = std::max(max_tput, p.output_throughput), max_tpot = std::max(max_tpot, p.median_tpot_ms);
  const double tput_step = nice_step(max_tput, 5), tpot_step = nice_step(max_tpot, 5);
  const double tput_top = std::max(tput_step, std::ceil(max_tput / tput_step) * tput_step);
  const double tpot_top = std::max(tpot_step, std::ceil(max_tpot / tpot_step) * tpot_step);
  // Concurrency levels are evenly spaced (1, 8, 16, 64 ... read better than on a linear axis).
  auto x_of = [&](size_t i) { return left + plot_w * (double(i) + 0.5) / double(std::max<size_t>(points.size(), 1)); };
  auto y_tput = [&](double v) { return top + plot_h * (1 - v / tput_top); };
  auto y_tpot = [&](double v) { return top + plot_h * (1 - v / tpot_top); };
  const char* tput_color = "#1f77b4";
  const char* tpot_color = "#d62728";

  std::string s;
  s += fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
  s += fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
                   "font-family=\"sans-serif\" font-size=\"12\">\n", width, height);
  s += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"white\"/>\n", width, height);
  s += fmt::format("<text x=\"{}\" y=\"28\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n", width / 2, escape_xml(title));
  s += "<g id=\"grid\" stroke=\"#dddddd\" stroke-width=\"1\">\n";
  for (double v = 0; v <= tput_top + tput_step / 2; v += tput_step)
    s += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\"/>\n", left, y_tput(v), left + plot_w, y_tput(v));
  s += "</g>\n";
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n", left, top, plot_w, plot_h);
  s += fmt::format("<g id=\"left-axis\" fill=\"{}\" text-anchor=\"end\">\n", tput_color);
  for (double v = 0; v <= tput_top + tput_step / 2; v += tput_step)
    s += fmt::format("<text x=\"{}\" y=\"{:.1f}\">{}</text>\n", left - 6, y_tput(v) + 4, number(v));
  s += fmt::format("<text transform=\"translate(20 {:.1f}) rotate(-90)\" text-anchor=\"middle\">output tok/s</text>\n</g>\n",
                   top + plot_h / 2);
  s += fmt::format("<g id=\"right-axis\" fill=\"{}\" text-anchor=\"start\">\n", tpot_color);
  for (double v = 0; v <= tpot_top + tpot_step / 2; v += tpot_step)
    s += fmt::format("<text x=\"{}\" y=\"{:.1f}\">{}</text>\n", left + plot_w + 6, y_tpot(v) + 4, number(v));
  s += fmt::format("<text transform=\"translate({} {:.1f}) rotate(90)\" text-anchor=\"middle\">median TPOT (ms)</text>\n</g>\n",
                   width - 20, top + plot_h / 2);
  s += "<g id=\"x-axis\" text-anchor=\"middle\">\n";
  for (size_t i = 0; i < points.size(); ++i)
    s += fmt::format("<text x=\"{:.1f}\" y=\"{}\">{}</text>\n", x_of(i), top + plot_h + 18, points[i].concurrency);
  s += fmt::format("<text x=\"{}\" y=\"{}\">concurrency</text>\n</g>\n", left + plot_w / 2, height - 16);
  auto series = [&](const char* id, const char* color, auto y_of, auto value_of) {
    std::string pts;
    for (size_t i = 0; i < points.size(); ++i) pts += fmt::format("{}{:.1f},{:.1f}", i ? " " : "", x_of(i), y_of(value_of(points[i])));
    s += fmt::format("<g id=\"{}\" stroke=\"{}\" fill=\"{}\">\n", id, color, color);
    s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke-width=\"2\"/>\n", pts);
    for (size_t i = 0; i < points.size(); ++i)
      s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\"><title>{}</title></circle>\n", x_of(i),
                       y_of(value_of(points[i])), number(value_of(points[i])));
    s += "</g>\n";
  };
  series("output-throughput", tput_color, y_tput, [](const SweepPoint& p) { return p.output_throughput; });
  series("median-tpot", tpot_color, y_tpot, [](const SweepPoint& p) { return p.median_tpot_ms; });
  s += fmt::format("<g id=\"legend\"><rect x=\"{0}\" y=\"{1}\" width=\"12\" height=\"3\" fill=\"{2}\"/>"
                   "<text x=\"{3}\" y=\"{4}\">output tok/s</text>"
                   "<rect x=\"{5}\" y=\"{1}\" width=\"12\" height=\"3\" fill=\"{6}\"/>"
                   "<text x=\"{7}\" y=\"{4}\">median TPOT (ms)</text></g>\n",
                   left + 10, top + 12, tput_color, left + 26, top + 16, left + 130, tpot_color, left + 146);
  s += "</svg>\n";
  return s;
}

}  // namespace dsv4::bench_serving
