// One streamed request against an OpenAI-compatible endpoint, measured as vLLM's request
// functions measure it (vllm/benchmarks/lib/endpoint_request_func.py):
// - TTFT: from sending the request to the first SSE chunk whose `choices` is non-empty (the
//   chat role chunk counts, as in vLLM; its text may be empty);
// - ITL: every gap between consecutive chunks with non-empty choices (chunks that arrive in one
//   read share its arrival time, so a gap may be 0, as with aiohttp's iter_any());
// - latency (E2EL): from sending to the last chunk with non-empty choices (the usage chunk and
//   [DONE] are not counted);
// - output tokens: usage.completion_tokens (stream_options.include_usage is always requested);
//   prompt tokens: usage.prompt_tokens when the server reports it.
// A request fails on a transport error, an HTTP status other than 200, an `error` object in the
// stream, a stream without `data: [DONE]`, or no chunk with choices.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_serving/dataset.h"
#include "bench_serving/http_client.h"

namespace dsv4::bench_serving {

enum class EndpointKind { Completions, ChatCompletions };
// From the path's suffix: ".../chat/completions" or ".../completions"; throws dsv4::Error otherwise.
EndpointKind endpoint_kind(const std::string& endpoint);

struct RequestOptions {
  std::string endpoint = "/v1/completions";
  std::string model;
  bool ignore_eos = false;
  std::optional<double> temperature = 0.0;  // unset: the server's default
  nlohmann::json extra_body;                // merged into every request body (an object, or null)
};

struct RequestOutput {
  bool success = false;
  std::string error;
  std::string generated_text;
  double start_time = 0;  // seconds on the steady clock (steady_seconds())
  double ttft = 0;        // seconds
  double latency = 0;     // seconds
  std::vector<double> itl;  // seconds
  int64_t prompt_len = 0;
  int64_t output_tokens = 0;   // usage.completion_tokens; 0 if the server reported none
  int64_t content_chunks = 0;  // chunks with non-empty choices
  bool usage_reported = false;
};

double steady_seconds();

// The JSON body vLLM's request function sends for this sample.
std::string request_body(const SampleRequest& sample, const RequestOptions& options);

RequestOutput run_request(HttpClient& client, const SampleRequest& sample, const RequestOptions& options);

// The model list of GET /v1/models: the first model's id. Throws dsv4::Error with a clear
// message when the server cannot be reached or answers something else.
std::string first_served_model(HttpClient& client);

}  // namespace dsv4::bench_serving
