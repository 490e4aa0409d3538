// Splits a Server-Sent Events byte stream into events as bytes arrive (the network may cut a
// stream anywhere, also inside a UTF-8 sequence or a line). An event ends at a blank line; its
// `data:` lines are joined with '\n'; comment lines (": ping") and other fields are skipped.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace dsv4::bench_serving {

class SseReader {
 public:
  // Appends bytes; returns the data of every event completed by them, in order.
  std::vector<std::string> feed(std::string_view bytes);
  // The data of a last event the stream did not end with a blank line (empty if none).
  std::string flush();

 private:
  void take_line(std::string_view line, std::vector<std::string>& events);
  std::string pending_;     // bytes after the last complete line
  std::string data_;        // data of the event being read
  bool has_data_ = false;
};

}  // namespace dsv4::bench_serving
