#include "serve/stop_matcher.h"

#include <algorithm>

namespace dsv4::openai {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

StopStringMatcher::Result StopStringMatcher::push(std::string_view delta) {
  Result result;
  if (stopped_) return result;
  held_.append(delta);
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const std::string& stop : stops_) {
    const size_t position = held_.find(stop);
    if (position != std::string::npos && position < best) {
      best = position;
      best_stop = &stop;
    }
  }
  if (best_stop != nullptr) {
    result.text = held_.substr(0, best);
    result.stopped = stopped_ = true;
    result.matched = *best_stop;
    held_.clear();
    return result;
  }
  // Keep the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    for (size_t length = std::min(held_.size(), stop.size() - 1); length > hold; --length) {
      if (std::string_view(held_).substr(held_.size() - length) == std::string_view(stop).substr(0, length)) {
        hold = length;
        break;
      }
    }
  }
  result.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return result;
}

std::string StopStringMatcher::finish() {
  std::string rest = stopped_ ? std::string() : std::move(held_);
  held_.clear();
  return rest;
}

}  // namespace dsv4::openai
