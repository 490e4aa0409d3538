// The endpoints that do not generate: models, health, version, metrics, tokenize, detokenize.
#include <fmt/format.h>
#include <httplib.h>

#include <string_view>

#include "core/heap.h"
#include "serve/http/endpoints.h"

namespace dsv4 {
const char* version_string();  // serve_version.cpp
}

namespace dsv4::serve {

using json = nlohmann::ordered_json;

void handle_models(ServerContext& context, const httplib::Request&, httplib::Response& res) {
  if (!context.require_ready(res)) return;
  openai::ModelCard card;
  card.id = context.model_name;
  card.created = context.created;
  card.root = context.model_root;
  card.max_model_len = context.service.max_model_len();
  send_json(res, openai::models_json({card}));
}

// 200 with an empty body once the engine runs (vLLM's answer), 503 while loading or after a failed load.
void handle_health(ServerContext& context, const httplib::Request&, httplib::Response& res) {
  if (!context.require_ready(res)) return;
  res.status = 200;
}

void handle_version(ServerContext&, const httplib::Request&, httplib::Response& res) {
  std::string_view version = version_string();  // "dsv4 X.Y.Z"
  if (const size_t space = version.rfind(' '); space != std::string_view::npos) version.remove_prefix(space + 1);
  json body;
  body["version"] = std::string(version);
  send_json(res, body);
}

// Answered while loading too (engine figures are zero then), so a scraper never sees a gap.
void handle_metrics(ServerContext& context, const httplib::Request&, httplib::Response& res) {
  res.status = 200;
  res.set_content(context.metrics.render(context.service.stats(), resident_memory_bytes()), "text/plain; version=0.0.4; charset=utf-8");
}

void handle_tokenize(ServerContext& context, const httplib::Request& req, httplib::Response& res) {
  if (!context.require_ready(res)) return;
  openai::Parsed<openai::TokenizeRequest> parsed = openai::parse_tokenize_request(req.body, context.limits());
  if (!parsed.ok()) return send_error(res, *parsed.error);
  const openai::TokenizeRequest& request = *parsed.value;
  if (!context.check_model(request.model, res)) return;
  const Tokenizer& tokenizer = context.service.tokenizer();
  std::vector<int32_t> ids;
  if (request.chat) {
    ids = tokenizer.encode(request.chat->prompt);  // the encoded conversation starts with BOS text
  } else {
    if (request.add_special_tokens) ids.push_back(int32_t(context.service.config().bos_token_id));
    tokenizer.encode_into(request.prompt, ids);
  }
  json body;
  body["count"] = ids.size();
  body["max_model_len"] = context.service.max_model_len();
  body["tokens"] = ids;
  if (request.return_token_strs) {
    json strs = json::array();
    for (int32_t id : ids) strs.push_back(std::string(tokenizer.token_bytes(id)));
    body["token_strs"] = std::move(strs);
  } else {
    body["token_strs"] = nullptr;
  }
  send_json(res, body);
}

void handle_detokenize(ServerContext& context, const httplib::Request& req, httplib::Response& res) {
  if (!context.require_ready(res)) return;
  openai::Parsed<openai::DetokenizeRequest> parsed = openai::parse_detokenize_request(req.body, context.limits());
  if (!parsed.ok()) return send_error(res, *parsed.error);
  const openai::DetokenizeRequest& request = *parsed.value;
  if (!context.check_model(request.model, res)) return;
  const Tokenizer& tokenizer = context.service.tokenizer();
  for (size_t i = 0; i < request.tokens.size(); ++i)
    if (!tokenizer.is_known(request.tokens[i]))
      return send_error(res, openai::bad_request(fmt::format("Token id {} in 'tokens[{}]' is not in the tokenizer's vocabulary.",
                                                             request.tokens[i], i),
                                                 fmt::format("tokens[{}]", i)));
  json body;
  body["prompt"] = tokenizer.decode(request.tokens);
  send_json(res, body);
}

}  // namespace dsv4::serve
