// The HTTP endpoints, each a handler over the server context (server.cpp routes to them).
#pragma once
#include "serve/http/generation.h"

namespace dsv4::serve {

// POST /v1/chat/completions (chat_endpoint.cpp)
void handle_chat_completions(ServerContext& context, const httplib::Request& req, httplib::Response& res);
// POST /v1/completions (completion_endpoint.cpp)
void handle_completions(ServerContext& context, const httplib::Request& req, httplib::Response& res);

// info_endpoints.cpp
void handle_models(ServerContext& context, const httplib::Request& req, httplib::Response& res);      // GET /v1/models
void handle_health(ServerContext& context, const httplib::Request& req, httplib::Response& res);      // GET /health
void handle_version(ServerContext& context, const httplib::Request& req, httplib::Response& res);     // GET /version
void handle_metrics(ServerContext& context, const httplib::Request& req, httplib::Response& res);     // GET /metrics
void handle_tokenize(ServerContext& context, const httplib::Request& req, httplib::Response& res);    // POST /tokenize
void handle_detokenize(ServerContext& context, const httplib::Request& req, httplib::Response& res);  // POST /detokenize

// GET /: the chat page (chat_page.cpp)
void handle_chat_page(ServerContext& context, const httplib::Request& req, httplib::Response& res);

}  // namespace dsv4::serve
