// Encode throughput of the C++ tokenizer on one core, over the parity corpus
// (tests/data/tokenizer/parity.jsonl). Not a test: scripts/tokenizer/bench.sh runs it next to the
// same measurement of Hugging Face's library through node and prints both.
//   tokenizer_bench [PARITY_JSONL] [SECONDS]
#include <fmt/core.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "serve/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

// Runs `pass` until `seconds` have passed (at least twice); returns MB/s of `bytes_per_pass`.
template <typename Pass>
double throughput(size_t bytes_per_pass, double seconds, Pass&& pass) {
  pass();  // warm-up
  size_t passes = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  while (passes < 2 || elapsed < seconds) {
    pass();
    ++passes;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return static_cast<double>(bytes_per_pass) * passes / elapsed / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string path = argc > 1 ? argv[1] : std::string(DSV4_TEST_DATA) + "/tokenizer/parity.jsonl";
    const double seconds = argc > 2 ? std::stod(argv[2]) : 3.0;
    std::ifstream in(path);
    if (!in) dsv4::fail("cannot read {}", path);
    std::vector<std::string> texts;
    std::string line;
    std::getline(in, line);  // header
    size_t bytes = 0;
    while (std::getline(in, line)) {
      texts.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
      bytes += texts.back().size();
    }
    std::string joined;
    for (const std::string& text : texts) joined += text;
    const dsv4::Tokenizer tokenizer = dsv4::Tokenizer::load_default();
    size_t sink = 0;
    const double per_string = throughput(bytes, seconds, [&] {
      for (const std::string& text : texts) sink += tokenizer.encode(text).size();
    });
    const double whole = throughput(joined.size(), seconds, [&] { sink += tokenizer.encode(joined).size(); });
    fmt::print("{{\"strings\": {}, \"bytes\": {}, \"per_string_mb_s\": {:.2f}, \"whole_corpus_mb_s\": {:.2f}, \"sink\": {}}}\n",
               texts.size(), bytes, per_string, whole, sink % 10);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
