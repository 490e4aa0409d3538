#include "serve/http/server.h"

#include <httplib.h>
#include <pthread.h>
#include <sys/socket.h>

#include <algorithm>
#include <condition_variable>
#include <csignal>
#include <ctime>
#include <thread>

#include "core/log.h"
#include "serve/http/endpoints.h"

namespace dsv4::serve {
namespace {

using namespace std::chrono_literals;

// The compiled cpp-httplib sets a listen backlog of 5: a burst of clients connecting at once
// would have SYNs dropped and retried a second later. listen() again on the bound socket
// raises it (Linux updates the backlog of a listening socket).
constexpr int kListenBacklog = 1024;

class HttpServer : public httplib::Server {
 public:
  // The bound port, or -1.
  int bind_port(const std::string& host, int port) {
    int bound = port;
    if (port == 0) bound = bind_to_any_port(host);
    else if (!bind_to_port(host, port)) bound = -1;
    if (bound > 0) ::listen(svr_sock_, kListenBacklog);
    return bound;
  }
};

// Constant-time comparison, so response timing does not reveal how much of a key was right.
bool same_secret(const std::string& given, const std::string& expected) {
  if (given.size() != expected.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < given.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ expected[i]);
  return diff == 0;
}

bool needs_key(const std::string& path) { return path == "/v1" || path.rfind("/v1/", 0) == 0; }

// Stopping: requested by a signal, a failed load or the listener's end, carried out on one
// thread. The engine goes first (every stream gets its final event and its handler returns),
// then the listener, whose stop joins the worker threads. server.stop() before listening has
// begun is a no-op in cpp-httplib, so it is repeated until the listener has returned.
class Stopper {
 public:
  Stopper(HttpServer& server, ModelService& service) : server_(server), service_(service), thread_([this] { run(); }) {}
  ~Stopper() {
    listener_returned();
    request();
    thread_.join();
  }
  void request() {
    {
      std::lock_guard lock(mutex_);
      requested_ = true;
    }
    changed_.notify_all();
  }
  void listener_returned() {
    {
      std::lock_guard lock(mutex_);
      listener_done_ = true;
    }
    changed_.notify_all();
  }
  // Sleeps up to `duration` unless a stop is requested; true when it was.
  bool wait_for_stop(std::chrono::duration<double> duration) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, duration, [&] { return requested_; });
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return requested_; });
    lock.unlock();
    service_.shutdown();
    lock.lock();
    while (!listener_done_) {
      lock.unlock();
      server_.stop();
      lock.lock();
      changed_.wait_for(lock, 20ms, [&] { return listener_done_; });
    }
  }

  HttpServer& server_;
  ModelService& service_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool requested_ = false, listener_done_ = false;
  std::thread thread_;
};

// SIGINT and SIGTERM are blocked in every thread (the mask is inherited, so this must exist
// before any other thread starts) and taken by sigwait on a thread of their own, where stopping
// may do anything; a handler could only set a flag.
class SignalWatcher {
 public:
  SignalWatcher() {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGINT);
    sigaddset(&signals_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals_, &previous_);
  }
  ~SignalWatcher() {
    stop();
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  // Ends the watching thread (before what its callback uses goes away).
  void stop() {
    if (!thread_.joinable()) return;
    done_ = true;
    pthread_kill(thread_.native_handle(), SIGTERM);
    thread_.join();
  }
  void start(std::function<void(int)> on_signal) {
    thread_ = std::thread([this, on_signal = std::move(on_signal)] {
      int signal = 0;
      if (sigwait(&signals_, &signal) == 0 && !done_) on_signal(signal);
    });
  }

 private:
  sigset_t signals_, previous_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

void set_error_handlers(HttpServer& server, size_t max_request_bytes) {
  // cpp-httplib calls the error handler for every status ≥ 400, including the handlers' own
  // errors; those already carry their OpenAI error body and are left as they are.
  server.set_error_handler(httplib::Server::HandlerWithResponse([max_request_bytes](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const int status = res.status;
    openai::ApiError error;
    if (status == 404) error = openai::route_not_found(req.method, req.path);
    else if (status == 413) error = openai::body_too_large(max_request_bytes);
    else if (status == 414) error = openai::bad_request("The request URI is too long.");
    else if (status < 500) error = openai::bad_request("Malformed HTTP request.");
    else error = openai::internal_error("Internal server error.");
    send_error(res, error);
    res.status = status;  // keep the library's status (405, 414, ...) where it differs from the kind's
    return httplib::Server::HandlerResponse::Handled;
  }));
  server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr exception) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(exception);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, openai::internal_error("Internal server error: " + what));
  });
}

void add_routes(HttpServer& server, ServerContext& context) {
  using Handler = void (*)(ServerContext&, const httplib::Request&, httplib::Response&);
  auto bind = [&context](Handler handler) {
    return [&context, handler](const httplib::Request& req, httplib::Response& res) { handler(context, req, res); };
  };
  server.Post("/v1/chat/completions", bind(handle_chat_completions));
  server.Post("/v1/completions", bind(handle_completions));
  server.Get("/v1/models", bind(handle_models));
  server.Get("/health", bind(handle_health));
  server.Get("/version", bind(handle_version));
  server.Get("/metrics", bind(handle_metrics));
  server.Post("/tokenize", bind(handle_tokenize));
  server.Post("/detokenize", bind(handle_detokenize));
  server.Get("/", bind(handle_chat_page));
  server.Get("/index.html", bind(handle_chat_page));
}

}  // namespace

int run_server(const ServerOptions& options, const ModelLoader& loader) {
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not the end of the process
  SignalWatcher signals;          // first: every thread started below inherits the mask

  ModelService service;
  const std::string model_name = options.served_model_name.empty() ? options.model_dir : options.served_model_name;
  ServerMetrics metrics(model_name, options.engine.max_model_len > 0 ? options.engine.max_model_len : int64_t(1) << 20);
  ServerContext context{service, metrics, model_name, options.model_dir, int64_t(std::time(nullptr))};

  HttpServer server;
  const size_t threads = size_t(std::max(options.http_threads, 1));
  server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server.set_payload_max_length(options.max_request_bytes);
  server.set_tcp_nodelay(true);  // an SSE chunk must not wait for the previous one's ACK (Nagle)
  server.set_keep_alive_max_count(10000);
  server.set_read_timeout(30, 0);
  server.set_write_timeout(60, 0);  // a client that stops reading for this long is dropped
  server.set_logger([](const httplib::Request& req, const httplib::Response& res) {
    log_debug("{} {} → {}", req.method, req.path, res.status);
  });
  set_error_handlers(server, options.max_request_bytes);
  if (!options.api_key.empty()) {
    server.set_pre_routing_handler([key = options.api_key](const httplib::Request& req, httplib::Response& res) {
      if (!needs_key(req.path) || same_secret(req.get_header_value("Authorization"), "Bearer " + key))
        return httplib::Server::HandlerResponse::Unhandled;
      send_error(res, openai::unauthorized());
      return httplib::Server::HandlerResponse::Handled;
    });
  }
  add_routes(server, context);

  const int port = server.bind_port(options.host, options.port);
  if (port < 0) {
    log_info("error: cannot listen on {}:{}", options.host, options.port);
    return 1;
  }
  log_info("listening on http://{}:{} (model {} loading)", options.host, port, model_name);

  std::atomic<bool> load_failed{false};
  Stopper stopper(server, service);
  signals.start([&](int signal) {
    log_info("signal {}: shutting down", signal);
    stopper.request();
  });
  std::thread loading([&] {
    if (options.startup_delay_seconds > 0 && stopper.wait_for_stop(std::chrono::duration<double>(options.startup_delay_seconds))) return;
    service.load(loader, options.engine);
    if (service.state() == ModelService::State::Failed) {
      log_info("error: the model failed to load: {}", service.error());
      load_failed = true;
      stopper.request();
    } else if (service.state() == ModelService::State::Ready) {
      log_info("ready: serving '{}' (max_model_len {})", model_name, service.max_model_len());
    }
  });

  server.listen_after_bind();
  stopper.listener_returned();
  stopper.request();
  loading.join();
  signals.stop();
  return load_failed ? 1 : 0;
}

}  // namespace dsv4::serve
