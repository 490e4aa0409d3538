// `dsv4 serve`: an OpenAI-compatible HTTP server (cpp-httplib) over the engine. It listens first
// and loads the model on a thread of its own, so GET /health answers 503 while loading and 200
// after. Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
// GET /metrics, POST /tokenize, POST /detokenize, GET /version. With an API key every /v1 route
// needs "Authorization: Bearer KEY" (401 otherwise); bodies over the limit are refused with 413.
// SIGINT / SIGTERM stop it: requests in flight end (streams with an error event), then it exits.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "serve/http/model_service.h"

namespace dsv4::serve {

struct ServerOptions {
  std::string model_dir;
  std::string host = "127.0.0.1";  // loopback unless asked otherwise
  int port = 8000;                 // 0: any free port (the log line "listening on" names it)
  std::string api_key;             // empty: no authentication
  std::string served_model_name;   // empty: the model directory as given
  EngineOptions engine;
  size_t max_request_bytes = 32u << 20;  // larger bodies get 413
  int http_threads = 256;                // connections served at once (each holds a thread)
  double startup_delay_seconds = 0;      // wait before loading (tests of the loading state)
};

// Serves until SIGINT / SIGTERM; returns the process exit code (1 when binding or loading failed).
int run_server(const ServerOptions& options, const ModelLoader& loader);

}  // namespace dsv4::serve
