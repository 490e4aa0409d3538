// The requests of a benchmark run: vLLM's `random` dataset, or prompts from a JSON-lines file.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsv4::bench_serving {

struct SampleRequest {
  std::string prompt_text;          // a text prompt (completions) or the user message (chat)
  std::vector<int32_t> prompt_ids;  // a token-id prompt (completions only); used when non-empty
  nlohmann::json messages;          // a whole chat message list (chat only); used when not null
  int64_t prompt_len = 0;           // tokens as the dataset knows them; the server's usage replaces it
  int64_t output_len = 0;           // max_tokens to ask for
};

struct RandomDatasetOptions {
  int64_t input_len = 1024;
  int64_t output_len = 128;
  double range_ratio = 0.0;   // lengths uniform in [floor(L·(1−r)), ceil(L·(1+r))] (vLLM), r in [0, 1)
  int64_t vocab_size = 32000; // token-id prompts use ids below this
  bool token_ids = true;      // false: text of common words (one token each in usual BPE vocabularies)
  uint64_t seed = 0;
};

// vLLM's random dataset without a tokenizer: per request an input and an output length drawn as
// above; the prompt is vLLM's token sequence (offset + i + j) mod vocab_size with a random offset
// sent as token ids (exact lengths on /v1/completions), or, for chat and for servers that take
// only text, `input_len` words drawn from a fixed list (the server's usage then gives the length).
std::vector<SampleRequest> random_dataset(int64_t num_requests, const RandomDatasetOptions& options);

// A JSON-lines file, one request per line: {"prompt": "text" | [ids], "output_len": N} or
// {"messages": [...], "output_len": N}; "max_tokens" is accepted for "output_len", which defaults
// to `default_output_len`; "input_len" optionally states the prompt's tokens. Requests are taken in
// file order and repeated when the file has fewer than num_requests lines. Throws dsv4::Error
// naming the file and line on a malformed line.
std::vector<SampleRequest> jsonl_dataset(const std::string& path, int64_t num_requests, int64_t default_output_len);

// --dataset random|FILE.jsonl with the random options (a file's default output length is
// random.output_len). Chat endpoints get text prompts.
struct DatasetOptions {
  std::string dataset = "random";
  RandomDatasetOptions random;
};
std::vector<SampleRequest> make_dataset(const DatasetOptions& options, int64_t num_requests, bool chat);

}  // namespace dsv4::bench_serving
