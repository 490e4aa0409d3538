#include "bench_serving/sse_reader.h"

namespace dsv4::bench_serving {

std::vector<std::string> SseReader::feed(std::string_view bytes) {
  std::vector<std::string> events;
  pending_.append(bytes);
  size_t start = 0;
  for (size_t nl = pending_.find('\n', start); nl != std::string::npos; nl = pending_.find('\n', start)) {
    std::string_view line(pending_.data() + start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    take_line(line, events);
    start = nl + 1;
  }
  pending_.erase(0, start);
  return events;
}

std::string SseReader::flush() {
  std::vector<std::string> events;
  if (!pending_.empty()) take_line(pending_, events);
  pending_.clear();
  take_line("", events);
  return events.empty() ? std::string() : events.back();
}

void SseReader::take_line(std::string_view line, std::vector<std::string>& events) {
  if (line.empty()) {  // end of an event
    if (has_data_) events.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line.front() == ':') return;  // comment
  const size_t colon = line.find(':');
  std::string_view field = line.substr(0, colon), value;
  if (colon != std::string_view::npos) {
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field != "data") return;
  if (has_data_) data_ += '\n';
  data_.append(value);
  has_data_ = true;
}

}  // namespace dsv4::bench_serving
