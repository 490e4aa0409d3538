#include "scripted_server.h"

#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace dsv4::test {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {
double seconds(Clock::time_point t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); }
}  // namespace

struct ScriptedServer::Impl {
  Script script;
  httplib::Server server;
  std::thread thread;
  std::atomic<bool> stopping{false};
  mutable std::mutex served_mu;
  std::vector<ServedRequest> served;
};

namespace {

struct Stream {
  bool chat = false;
  int64_t tokens = 0, prompt_tokens = 0, next = 0;  // next: the chunk to send
  std::string answer;                               // a gate answer, sent as the one token
  Clock::time_point arrival;
  ServedRequest record;
  bool cut = false, error_event = false;
};

std::string sse(const json& j) { return "data: " + j.dump() + "\n\n"; }

std::string token_chunk(const Stream& s, const Script& sc, const std::string& text, bool last) {
  json choice = {{"index", 0}, {"finish_reason", last ? json("length") : json(nullptr)}};
  if (s.chat) choice["delta"] = {{"content", text}};
  else choice["text"] = text;
  return sse({{"id", "scripted"}, {"object", s.chat ? "chat.completion.chunk" : "text_completion"}, {"model", sc.model},
              {"choices", json::array({choice})}});
}

void handle_generation(ScriptedServer::Impl& impl, std::atomic<int64_t>& counter, bool chat, const httplib::Request& req,
                       httplib::Response& res) {
  const Script& sc = impl.script;
  const int64_t number = counter++;
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) {
    res.status = 400;
    res.set_content(R"({"error":{"message":"bad JSON","type":"invalid_request_error"}})", "application/json");
    return;
  }
  auto s = std::make_shared<Stream>();
  s->chat = chat;
  s->arrival = Clock::now();
  s->record.arrival = seconds(s->arrival);
  std::string prompt;
  if (chat) {
    for (auto& m : body["messages"]) prompt += m.value("content", "");
    s->prompt_tokens = int64_t(prompt.size() / 4 + 1);
  } else if (body["prompt"].is_array()) {
    s->prompt_tokens = int64_t(body["prompt"].size());
  } else {
    prompt = body["prompt"].get<std::string>();
    s->prompt_tokens = int64_t(prompt.size() / 4 + 1);
  }
  const int64_t max_tokens = body.value(chat ? "max_completion_tokens" : "max_tokens", int64_t(16));
  s->tokens = sc.tokens > 0 ? sc.tokens : max_tokens;
  if (!sc.gate_question.empty() && prompt.find(sc.gate_question) != std::string::npos) {
    s->answer = sc.gate_answer;
    s->tokens = 1;
  }
  if (sc.fail_from >= 0 && number >= sc.fail_from) {
    if (sc.failure == Script::Failure::Http500) {
      res.status = 500;
      res.set_content(R"({"error":{"message":"scripted failure","type":"internal_error","code":500}})", "application/json");
      return;
    }
    s->cut = sc.failure == Script::Failure::CutStream;
    s->error_event = sc.failure == Script::Failure::ErrorEvent;
  }
  res.set_chunked_content_provider("text/event-stream", [&impl, s](size_t, httplib::DataSink& sink) {
    const Script& sc = impl.script;
    if (impl.stopping) return false;
    if ((s->cut || s->error_event) && s->next == 2) {
      if (s->cut) return false;  // drop the connection mid-stream
      const std::string e = sse({{"error", {{"message", "scripted error event"}, {"type", "internal_error"}, {"code", 500}}}});
      sink.write(e.data(), e.size());
      sink.write("data: [DONE]\n\n", 14);
      sink.done();
      return true;
    }
    if (s->next < s->tokens) {
      std::this_thread::sleep_until(s->arrival + std::chrono::duration_cast<Clock::duration>(
                                                     std::chrono::duration<double>(sc.ttft_s + double(s->next) * sc.itl_s)));
      std::string out;
      if (s->next == 0 && s->chat)  // the role chunk comes with the first token, as vLLM sends it
        out += sse({{"id", "scripted"}, {"object", "chat.completion.chunk"}, {"model", sc.model},
                    {"choices", json::array({{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}}})}});
      out += token_chunk(*s, sc, s->answer.empty() ? sc.token_text : s->answer, s->next + 1 == s->tokens);
      ++s->next;
      const bool ok = sink.write(out.data(), out.size());
      (s->next == 1 ? s->record.first_sent : s->record.last_sent) = seconds(Clock::now());
      if (s->next == 1) s->record.last_sent = s->record.first_sent;
      return ok;
    }
    std::string out;
    if (sc.report_usage)
      out += sse({{"id", "scripted"}, {"choices", json::array()},
                  {"usage", {{"prompt_tokens", s->prompt_tokens}, {"completion_tokens", s->tokens},
                             {"total_tokens", s->prompt_tokens + s->tokens}}}});
    out += "data: [DONE]\n\n";
    sink.write(out.data(), out.size());
    sink.done();
    std::lock_guard<std::mutex> lk(impl.served_mu);
    impl.served.push_back(s->record);
    return true;
  });
}

}  // namespace

ScriptedServer::ScriptedServer(Script script) : impl_(std::make_unique<Impl>()) {
  impl_->script = std::move(script);
  auto& svr = impl_->server;
  const int threads = impl_->script.threads;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  svr.set_keep_alive_max_count(100000);
  svr.set_keep_alive_timeout(1);
  svr.set_tcp_nodelay(true);
  svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json j = {{"object", "list"}, {"data", json::array({{{"id", impl_->script.model}, {"object", "model"}, {"root", impl_->script.model}}})}};
    res.set_content(j.dump(), "application/json");
  });
  svr.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(*impl_, requests_, false, req, res);
  });
  svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(*impl_, requests_, true, req, res);
  });
  // cpp-httplib listens with a backlog of 5: hundreds of clients connecting at once would overflow
  // it (dropped handshakes, retransmitted requests, stalls of a second). Listen again on the
  // same socket with a real backlog, which Linux applies to the listening socket.
  int listen_fd = -1;
  svr.set_socket_options([&listen_fd](int fd) {
    httplib::default_socket_options(fd);
    listen_fd = fd;
  });
  port_ = svr.bind_to_any_port("127.0.0.1");
  if (port_ <= 0 || listen_fd < 0 || ::listen(listen_fd, 4096) != 0)
    throw std::runtime_error("scripted server: cannot listen on a loopback port");
  impl_->thread = std::thread([this] { impl_->server.listen_after_bind(); });
  // is_running() turns true before the listening thread has made its pool of `threads` workers and
  // accepted anything; requests sent then wait for that (6 ms idle here, ~20 ms on a loaded
  // 2-core machine) and the first wave's TTFT is off the script by it. Ready means answering.
  httplib::Client probe("127.0.0.1", port_);
  probe.set_keep_alive(false);
  for (int attempt = 0;; ++attempt) {
    if (auto r = probe.Get("/v1/models"); r && r->status == 200) break;
    if (attempt == 1000) {  // (the listening thread must end before the throw: the destructor will not run)
      svr.stop();
      impl_->thread.join();
      throw std::runtime_error("scripted server: not answering on its loopback port");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

ScriptedServer::~ScriptedServer() {
  impl_->stopping = true;
  impl_->server.stop();
  impl_->thread.join();
}

std::vector<ServedRequest> ScriptedServer::served() const {
  std::lock_guard<std::mutex> lk(impl_->served_mu);
  return impl_->served;
}

int unused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw std::runtime_error("unused_port: cannot bind");
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace dsv4::test
