#include "bench_serving/request.h"

#include <chrono>

#include "bench_serving/sse_reader.h"
#include "core/error.h"

namespace dsv4::bench_serving {

using nlohmann::json;

EndpointKind endpoint_kind(const std::string& endpoint) {
  auto ends_with = [&](std::string_view s) {
    return endpoint.size() >= s.size() && endpoint.compare(endpoint.size() - s.size(), s.size(), s) == 0;
  };
  if (ends_with("chat/completions")) return EndpointKind::ChatCompletions;
  if (ends_with("completions")) return EndpointKind::Completions;
  fail("--endpoint '{}': expected /v1/completions or /v1/chat/completions", endpoint);
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string request_body(const SampleRequest& sample, const RequestOptions& o) {
  json body = json::object();
  body["model"] = o.model;
  if (endpoint_kind(o.endpoint) == EndpointKind::ChatCompletions) {
    if (!sample.messages.is_null()) body["messages"] = sample.messages;
    else body["messages"] = json::array({{{"role", "user"}, {"content", sample.prompt_text}}});
    body["max_completion_tokens"] = sample.output_len;
  } else {
    if (!sample.messages.is_null()) fail("a dataset line with \"messages\" needs --endpoint /v1/chat/completions");
    if (!sample.prompt_ids.empty()) body["prompt"] = sample.prompt_ids;
    else body["prompt"] = sample.prompt_text;
    body["max_tokens"] = sample.output_len;
  }
  if (o.temperature) body["temperature"] = *o.temperature;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (o.ignore_eos) body["ignore_eos"] = true;
  if (o.extra_body.is_object()) body.update(o.extra_body);
  return body.dump();
}

namespace {

// The text an error response or error event carries: OpenAI's {"error": {"message": ...}}, else
// the body itself (shortened).
std::string error_message(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) return e["message"].get<std::string>();
    if (e.is_string()) return e.get<std::string>();
  }
  return body.size() > 300 ? body.substr(0, 300) + "..." : body;
}

// Folds one SSE event into the output; returns false when the stream reported an error.
struct StreamState {
  bool done = false, first = false, failed = false;
  double last = 0;
};
bool take_event(const std::string& data, double arrival, bool chat, RequestOutput& out, StreamState& s) {
  if (data == "[DONE]") {
    s.done = true;
    return true;
  }
  json j = json::parse(data, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    out.error = "the stream sent a chunk that is not a JSON object: " + data.substr(0, 200);
    return false;
  }
  if (j.contains("error")) {
    out.error = "the server reported an error in the stream: " + error_message(data);
    return false;
  }
  auto choices = j.find("choices");
  if (choices != j.end() && choices->is_array() && !choices->empty()) {
    if (!s.first) {
      s.first = true;
      out.ttft = arrival - out.start_time;
    } else {
      out.itl.push_back(arrival - s.last);
    }
    s.last = arrival;
    ++out.content_chunks;
    const json& c = (*choices)[0];
    const json* text = nullptr;
    if (chat && c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content")) text = &c["delta"]["content"];
    if (!chat && c.contains("text")) text = &c["text"];
    if (text && text->is_string()) out.generated_text += text->get_ref<const std::string&>();
  }
  auto usage = j.find("usage");
  if (usage != j.end() && usage->is_object()) {
    if (usage->contains("completion_tokens") && (*usage)["completion_tokens"].is_number_integer()) {
      out.output_tokens = (*usage)["completion_tokens"].get<int64_t>();
      out.usage_reported = true;
    }
    if (usage->contains("prompt_tokens") && (*usage)["prompt_tokens"].is_number_integer())
      out.prompt_len = (*usage)["prompt_tokens"].get<int64_t>();
  }
  return true;
}

}  // namespace

RequestOutput run_request(HttpClient& client, const SampleRequest& sample, const RequestOptions& o) {
  RequestOutput out;
  out.prompt_len = sample.prompt_len;
  const bool chat = endpoint_kind(o.endpoint) == EndpointKind::ChatCompletions;
  const std::string body = request_body(sample, o);
  SseReader sse;
  StreamState s;
  std::string error_body;
  out.start_time = steady_seconds();
  s.last = out.start_time;
  HttpReply reply = client.post_streaming(o.endpoint, body, [&](int status, std::string_view piece) {
    if (status != 200) {  // keep the error body for the message
      if (error_body.size() < 4096) error_body.append(piece);
      return true;
    }
    const double arrival = steady_seconds();
    for (const std::string& data : sse.feed(piece))
      if (!take_event(data, arrival, chat, out, s)) {
        s.failed = true;
        return false;
      }
    return true;
  });
  if (!s.failed && reply.status == 200) {
    std::string tail = sse.flush();
    if (!tail.empty() && !take_event(tail, steady_seconds(), chat, out, s)) s.failed = true;
  }
  out.latency = s.last - out.start_time;
  if (s.failed) return out;  // out.error says why
  if (reply.status != 200 && reply.status != 0) {
    out.error = fmt::format("HTTP {}: {}", reply.status, error_message(error_body));
  } else if (!reply.error.empty()) {
    out.error = fmt::format("{} {}{}: {}", "POST", client.base().text, o.endpoint, reply.error);
  } else if (!s.done) {
    out.error = "the stream ended without data: [DONE]";
  } else if (!s.first) {
    out.error = "never received a chunk with choices to calculate TTFT";
  } else {
    out.success = true;
  }
  return out;
}

std::string first_served_model(HttpClient& client) {
  HttpReply r = client.get("/v1/models");
  if (!r.error.empty())
    fail("cannot reach the server at {} (GET /v1/models: {}); is it running?", client.base().text, r.error);
  if (r.status != 200) fail("GET {}/v1/models answered HTTP {}: {}", client.base().text, r.status, error_message(r.body));
  json j = json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() || !j["data"][0].contains("id"))
    fail("GET {}/v1/models: no model listed; give --model", client.base().text);
  return j["data"][0]["id"].get<std::string>();
}

}  // namespace dsv4::bench_serving
