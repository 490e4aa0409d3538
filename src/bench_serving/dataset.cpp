#include "bench_serving/dataset.h"

#include <cmath>
#include <fstream>
#include <random>

#include "core/error.h"

namespace dsv4::bench_serving {

namespace {

// Common English words: each is a single token (with its leading space) in the usual BPE
// vocabularies, so `n` of them make a prompt of about n tokens.
constexpr const char* kWords[] = {
    "the", "of", "and", "to", "in", "is", "it", "that", "for", "was", "on", "are", "as", "with", "his", "they",
    "at", "be", "this", "from", "have", "or", "by", "one", "had", "not", "but", "what", "all", "were", "when",
    "we", "there", "can", "an", "your", "which", "their", "said", "if", "do", "will", "each", "about", "how",
    "up", "out", "them", "then", "she", "many", "some", "so", "these", "would", "other", "into", "has", "more",
    "her", "two", "like", "him", "see", "time", "could", "no", "make", "than", "first", "been", "its", "who",
    "now", "people", "my", "made", "over", "did", "down", "only", "way", "find", "use", "may", "water", "long",
    "little", "very", "after", "words", "called", "just", "where", "most", "know", "get", "through", "back",
    "much", "before", "go", "good", "new", "write", "our", "used", "me", "man", "too", "any", "day", "same",
    "right", "look", "think", "also", "around", "another", "came", "come", "work", "three", "word", "must",
    "because", "does", "part", "even", "place", "well", "such", "here", "take", "why", "things", "help", "put",
    "years", "different", "away", "again", "off", "went", "old", "number", "great", "tell", "men", "say",
    "small", "every", "found", "still", "between", "name", "should", "home", "big", "give", "air", "line"};
constexpr size_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);

struct LengthRange {
  int64_t low, high;
};
LengthRange length_range(int64_t len, double ratio, int64_t min_low) {
  LengthRange r{int64_t(std::floor(double(len) * (1 - ratio))), int64_t(std::ceil(double(len) * (1 + ratio)))};
  r.low = std::max(r.low, min_low);
  r.high = std::max(r.high, r.low);
  return r;
}

}  // namespace

std::vector<SampleRequest> random_dataset(int64_t num_requests, const RandomDatasetOptions& o) {
  if (!(o.range_ratio >= 0 && o.range_ratio < 1)) fail("--random-range-ratio {} must be in [0, 1)", o.range_ratio);
  if (o.input_len < 1) fail("--random-input-len must be at least 1");
  if (o.output_len < 1) fail("--random-output-len must be at least 1");
  if (o.vocab_size < 2) fail("--random-vocab-size must be at least 2");
  const LengthRange in = length_range(o.input_len, o.range_ratio, 1), out = length_range(o.output_len, o.range_ratio, 1);
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int64_t> in_len(in.low, in.high), out_len(out.low, out.high), offset(0, o.vocab_size - 1);
  std::uniform_int_distribution<size_t> word(0, kNumWords - 1);
  std::vector<SampleRequest> requests(size_t(std::max<int64_t>(num_requests, 0)));
  for (size_t i = 0; i < requests.size(); ++i) {
    SampleRequest& r = requests[i];
    r.prompt_len = in_len(rng);
    r.output_len = out_len(rng);
    const int64_t off = offset(rng);
    if (o.token_ids) {
      r.prompt_ids.resize(size_t(r.prompt_len));
      for (int64_t j = 0; j < r.prompt_len; ++j) r.prompt_ids[size_t(j)] = int32_t((off + int64_t(i) + j) % o.vocab_size);
    } else {
      for (int64_t j = 0; j < r.prompt_len; ++j) {
        if (j) r.prompt_text += ' ';
        r.prompt_text += kWords[word(rng)];
      }
    }
  }
  return requests;
}

std::vector<SampleRequest> jsonl_dataset(const std::string& path, int64_t num_requests, int64_t default_output_len) {
  std::ifstream in(path);
  if (!in) fail("cannot read the dataset {}", path);
  std::vector<SampleRequest> lines;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) fail("{}:{}: not a JSON object", path, line_no);
    SampleRequest r;
    if (j.contains("messages")) {
      if (!j["messages"].is_array() || j["messages"].empty()) fail("{}:{}: \"messages\" must be a non-empty array", path, line_no);
      r.messages = j["messages"];
    } else if (j.contains("prompt") && j["prompt"].is_string()) {
      r.prompt_text = j["prompt"].get<std::string>();
    } else if (j.contains("prompt") && j["prompt"].is_array() && !j["prompt"].empty()) {
      for (auto& id : j["prompt"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0) fail("{}:{}: token ids must be non-negative integers", path, line_no);
        r.prompt_ids.push_back(id.get<int32_t>());
      }
      r.prompt_len = int64_t(r.prompt_ids.size());
    } else {
      fail("{}:{}: needs \"prompt\" (text or token ids) or \"messages\"", path, line_no);
    }
    r.output_len = default_output_len;
    for (const char* key : {"output_len", "max_tokens"})
      if (j.contains(key)) {
        if (!j[key].is_number_integer() || j[key].get<int64_t>() < 1) fail("{}:{}: \"{}\" must be a positive integer", path, line_no, key);
        r.output_len = j[key].get<int64_t>();
        break;
      }
    if (j.contains("input_len") && j["input_len"].is_number_integer()) r.prompt_len = j["input_len"].get<int64_t>();
    lines.push_back(std::move(r));
  }
  if (lines.empty()) fail("the dataset {} has no requests", path);
  std::vector<SampleRequest> requests;
  for (int64_t i = 0; i < num_requests; ++i) requests.push_back(lines[size_t(i) % lines.size()]);
  return requests;
}

std::vector<SampleRequest> make_dataset(const DatasetOptions& o, int64_t num_requests, bool chat) {
  if (num_requests < 1) fail("--num-prompts must be at least 1");
  if (o.dataset != "random") return jsonl_dataset(o.dataset, num_requests, o.random.output_len);
  RandomDatasetOptions r = o.random;
  if (chat) r.token_ids = false;
  return random_dataset(num_requests, r);
}

}  // namespace dsv4::bench_serving
