// A scripted OpenAI-compatible server for the benchmark client's tests: /v1/models,
// /v1/completions and /v1/chat/completions stream tokens on a fixed schedule (the first chunk
// `ttft_s` after the request arrived, then one every `itl_s`, each timed from the arrival so
// delays do not accumulate), with usage, and fail on request when told to. Loopback only, any
// free port; stopped by the destructor.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace dsv4::test {

struct Script {
  double ttft_s = 0.1;
  double itl_s = 0.02;
  int64_t tokens = 0;  // chunks with a token per response; 0: the request's max_tokens
  std::string token_text = " tok";
  // A prompt containing gate_question is answered with gate_answer, as one token.
  std::string gate_question = "17*23";
  std::string gate_answer = "391";
  // Requests numbered ≥ fail_from (0-based, in arrival order, gate included) fail as `failure` says.
  int64_t fail_from = -1;
  enum class Failure { Http500, CutStream, ErrorEvent } failure = Failure::Http500;
  bool report_usage = true;
  int threads = 32;  // connections served at once (each keep-alive connection holds a thread)
  std::string model = "scripted-model";
};

// What the server did for one streamed response (steady-clock seconds, shared with the client
// process on the same machine): when the request arrived, when its first and last token left.
struct ServedRequest {
  double arrival = 0, first_sent = 0, last_sent = 0;
};

class ScriptedServer {
 public:
  explicit ScriptedServer(Script script);
  ~ScriptedServer();
  int port() const { return port_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int64_t requests() const { return requests_.load(); }
  std::vector<ServedRequest> served() const;  // completed streams, in completion order

  struct Impl;  // the httplib server (scripted_server.cpp)

 private:
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  std::atomic<int64_t> requests_{0};
};

// A loopback port nothing listens on (bound, then released).
int unused_port();

}  // namespace dsv4::test
