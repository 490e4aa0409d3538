// POST /v1/completions: one engine request per prompt (text, list of texts, token ids or lists of
// token ids), all running at once; choice i answers prompt i. Text prompts start with BOS, as
// DeepSeek's tokenizer adds it (add_bos_token); token-id prompts are taken as they are.
#include <fmt/format.h>
#include <httplib.h>

#include <ctime>

#include "serve/http/endpoints.h"
#include "serve/openai_stream.h"

namespace dsv4::serve {
namespace {

struct PreparedPrompt {
  std::vector<int32_t> ids;
  std::string echo;  // the prompt's text, sent first with echo
};

// Text of ids the tokenizer knows (a model may accept ids its tokenizer lacks).
std::string known_text(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  std::vector<int32_t> known;
  for (int32_t id : ids)
    if (tokenizer.is_known(id)) known.push_back(id);
  return tokenizer.decode(known);
}

openai::Usage total_usage(const std::vector<std::unique_ptr<ChoiceRun>>& runs) {
  openai::Usage usage;
  for (const auto& run : runs) {
    usage.prompt_tokens += run->usage().prompt_tokens;
    usage.completion_tokens += run->usage().completion_tokens;
  }
  return usage;
}

std::vector<ChoiceRun*> pointers(const std::vector<std::unique_ptr<ChoiceRun>>& runs) {
  std::vector<ChoiceRun*> out;
  for (const auto& run : runs) out.push_back(run.get());
  return out;
}

class CompletionStream : public SseSource {
 public:
  CompletionStream(std::vector<std::unique_ptr<ChoiceRun>> runs, std::vector<std::string> echoes, openai::ResponseMeta meta,
                   bool include_usage)
      : runs_(std::move(runs)), echoes_(std::move(echoes)), meta_(std::move(meta)), include_usage_(include_usage),
        finish_sent_(runs_.size(), false) {
    for (size_t i = 0; i < runs_.size(); ++i) encoders_.emplace_back(meta_, i, include_usage);
  }

  std::string next(std::chrono::milliseconds wait, bool& finished) override {
    std::string out;
    if (complete_) return finished = true, out;
    if (!started_) {
      for (size_t i = 0; i < echoes_.size(); ++i) out += encoders_[i].push(echoes_[i]);
      started_ = true;
    }
    poll_runs(pointers(runs_), wait, [&](size_t i, std::string_view text, std::vector<openai::TokenLogprob> logprobs) {
      out += encoders_[i].push(text, std::move(logprobs));
    });
    bool all_sent = true;
    for (size_t i = 0; i < runs_.size(); ++i) {
      if (!runs_[i]->done() || finish_sent_[i]) {
        all_sent = all_sent && finish_sent_[i];
        continue;
      }
      if (runs_[i]->error()) {  // one failed choice ends the response; the others are cancelled
        abandon();
        finished = complete_ = true;
        return out + openai::sse_error(*runs_[i]->error());
      }
      out += encoders_[i].finish(runs_[i]->finish_reason());
      finish_sent_[i] = true;
    }
    if (all_sent) {
      if (include_usage_) out += openai::sse_usage_chunk(meta_, "text_completion", total_usage(runs_));
      out += openai::kSseDone;
      finished = complete_ = true;
    }
    return out;
  }

  void abandon() override {
    for (auto& run : runs_) run->abandon();
  }

 private:
  std::vector<std::unique_ptr<ChoiceRun>> runs_;
  std::vector<std::string> echoes_;
  openai::ResponseMeta meta_;
  bool include_usage_;
  std::vector<openai::CompletionStreamEncoder> encoders_;
  std::vector<bool> finish_sent_;
  bool started_ = false, complete_ = false;
};

}  // namespace

void handle_completions(ServerContext& context, const httplib::Request& req, httplib::Response& res) {
  const Clock::time_point arrival = Clock::now();
  if (!context.require_ready(res)) return;
  openai::Parsed<openai::CompletionRequest> parsed = openai::parse_completion_request(req.body, context.limits());
  if (!parsed.ok()) return send_error(res, *parsed.error);
  openai::CompletionRequest& completion = *parsed.value;
  if (!context.check_model(completion.model, res)) return;
  if (auto error = unsupported_params(completion.params)) return send_error(res, *error);
  if (completion.echo && completion.params.logprobs)
    return send_error(res, openai::bad_request("'echo' with 'logprobs' (prompt logprobs) is not supported.", "echo"));

  const Tokenizer& tokenizer = context.service.tokenizer();
  std::vector<PreparedPrompt> prompts;
  for (size_t i = 0; i < completion.prompts.size(); ++i) {
    const openai::CompletionPrompt& prompt = completion.prompts[i];
    PreparedPrompt prepared;
    if (prompt.is_tokens) {
      prepared.ids = prompt.token_ids;
      if (completion.echo) prepared.echo = known_text(tokenizer, prepared.ids);
    } else {
      prepared.ids = {int32_t(context.service.config().bos_token_id)};
      tokenizer.encode_into(prompt.text, prepared.ids);
      if (completion.echo) prepared.echo = prompt.text;
    }
    openai::GenerationParams params = completion.params;
    const std::string param = completion.prompts.size() == 1 ? "prompt" : fmt::format("prompt[{}]", i);
    if (auto error = openai::fit_context(params, int64_t(prepared.ids.size()), context.service.max_model_len(), param))
      return send_error(res, *error);
    prompts.push_back(std::move(prepared));
  }

  std::vector<std::unique_ptr<ChoiceRun>> runs;
  for (PreparedPrompt& prompt : prompts) {
    runs.push_back(std::make_unique<ChoiceRun>(context, std::move(prompt.ids), completion.params, arrival));
    if (runs.back()->error()) return send_error(res, *runs.back()->error());  // the others are cancelled
  }
  openai::ResponseMeta meta{openai::response_id("cmpl-", context.nonce()), int64_t(std::time(nullptr)), context.model_name};
  if (completion.params.stream) {
    std::vector<std::string> echoes;
    for (PreparedPrompt& prompt : prompts)
      if (completion.echo) echoes.push_back(std::move(prompt.echo));
    return stream_sse(req, res, std::make_shared<CompletionStream>(std::move(runs), std::move(echoes), std::move(meta),
                                                                  completion.params.include_usage));
  }

  if (!wait_for_runs(req, pointers(runs))) return send_error(res, *runs.front()->error());
  std::vector<openai::CompletionChoice> choices;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i]->error()) return send_error(res, *runs[i]->error());
    openai::CompletionChoice choice;
    choice.text = prompts[i].echo + runs[i]->text();
    choice.finish_reason = runs[i]->finish_reason();
    choice.with_logprobs = completion.params.logprobs;
    choice.logprobs = runs[i]->logprobs();
    choices.push_back(std::move(choice));
  }
  send_json(res, openai::completion_response_json(meta, choices, total_usage(runs)));
}

}  // namespace dsv4::serve
