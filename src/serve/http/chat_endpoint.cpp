// POST /v1/chat/completions: request → prompt text (chat_format) → ids → one engine request;
// the output goes through chat::OutputParser (reasoning_content, content, DSML tool calls), as
// SSE chunks (ChatStreamEncoder) or one chat.completion object.
#include <httplib.h>

#include <ctime>

#include "serve/chat_output_parser.h"
#include "serve/http/endpoints.h"
#include "serve/openai_stream.h"

namespace dsv4::serve {
namespace {

class ChatStream : public SseSource {
 public:
  ChatStream(std::unique_ptr<ChoiceRun> run, openai::ResponseMeta meta, chat::ThinkingMode mode, bool include_usage)
      : run_(std::move(run)), encoder_(std::move(meta), mode, include_usage) {}

  std::string next(std::chrono::milliseconds wait, bool& finished) override {
    std::string out;
    if (finished_) return finished = true, out;
    run_->poll(wait, [&](std::string_view text, std::vector<openai::TokenLogprob> logprobs) {
      out += encoder_.push(text, std::move(logprobs));
    });
    if (run_->done()) {
      finished = finished_ = true;
      out += run_->error() ? openai::sse_error(*run_->error()) : encoder_.finish(run_->finish_reason(), run_->usage());
    }
    return out;
  }
  void abandon() override { run_->abandon(); }

 private:
  std::unique_ptr<ChoiceRun> run_;
  openai::ChatStreamEncoder encoder_;
  bool finished_ = false;
};

}  // namespace

void handle_chat_completions(ServerContext& context, const httplib::Request& req, httplib::Response& res) {
  const Clock::time_point arrival = Clock::now();
  if (!context.require_ready(res)) return;
  openai::Parsed<openai::ChatRequest> parsed = openai::parse_chat_request(req.body, context.limits());
  if (!parsed.ok()) return send_error(res, *parsed.error);
  openai::ChatRequest& chat = *parsed.value;
  if (!context.check_model(chat.model, res)) return;
  if (auto error = unsupported_params(chat.params)) return send_error(res, *error);
  std::vector<int32_t> prompt = context.service.tokenizer().encode(chat.prompt);
  if (auto error = openai::fit_context(chat.params, int64_t(prompt.size()), context.service.max_model_len(), "messages"))
    return send_error(res, *error);

  auto run = std::make_unique<ChoiceRun>(context, std::move(prompt), chat.params, arrival);
  if (run->error()) return send_error(res, *run->error());
  openai::ResponseMeta meta{openai::response_id("chatcmpl-", context.nonce()), int64_t(std::time(nullptr)), context.model_name};
  if (chat.params.stream)
    return stream_sse(req, res,
                      std::make_shared<ChatStream>(std::move(run), std::move(meta), chat.encode.thinking_mode, chat.params.include_usage));

  if (!wait_for_runs(req, {run.get()}) || run->error()) return send_error(res, *run->error());
  openai::ChatResult result;
  result.output = chat::OutputParser::parse(run->text(), chat.encode.thinking_mode);
  result.finish_reason = run->finish_reason();
  result.with_logprobs = chat.params.logprobs;
  result.logprobs = run->logprobs();
  send_json(res, openai::chat_response_json(meta, result, run->usage()));
}

}  // namespace dsv4::serve
