// libFuzzer target: any request body gives either a typed request or a 400 error object — never
// a crash, an exception escaping, or an error JSON that cannot be serialised.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "serve/openai_request.h"

namespace {

[[noreturn]] void fail_with(const char* what) {
  std::fprintf(stderr, "%s\n", what);
  std::abort();
}

template <typename T>
void check(const dsv4::openai::Parsed<T>& parsed) {
  if (parsed.ok() == parsed.error.has_value()) fail_with("exactly one of value and error must be set");
  if (parsed.error) {
    if (dsv4::openai::http_status(parsed.error->kind) != 400) fail_with("a parse error must be a 400");
    if (parsed.error->message.empty()) fail_with("an error needs a message");
    dsv4::openai::error_body(*parsed.error);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const dsv4::openai::RequestLimits limits{.max_model_len = 4096, .vocab_size = 129280};
  const auto chat = dsv4::openai::parse_chat_request(body, limits);
  check(chat);
  if (chat.ok()) {
    dsv4::openai::GenerationParams params = chat.value->params;
    dsv4::openai::fit_context(params, static_cast<int64_t>(chat.value->prompt.size() % 5000), limits.max_model_len, "messages");
  }
  check(dsv4::openai::parse_completion_request(body, limits));
  return 0;
}
