// libFuzzer target: any bytes encode without crashing, decode back to the input with invalid
// UTF-8 repaired, and stream-decode to the same text.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "serve/detokenizer.h"
#include "serve/tokenizer.h"
#include "serve/utf8.h"

namespace {
const dsv4::Tokenizer* tokenizer = nullptr;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  static const dsv4::Tokenizer loaded = dsv4::Tokenizer::load_default();
  tokenizer = &loaded;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::vector<dsv4::TokenId> ids = tokenizer->encode(input);
  const std::string decoded = tokenizer->decode(ids);
  if (decoded != dsv4::utf8::repair(input)) {
    std::fprintf(stderr, "decode(encode(input)) differs from the repaired input\n");
    std::abort();
  }
  dsv4::StreamingDetokenizer stream(*tokenizer);
  std::string streamed;
  for (dsv4::TokenId id : ids) streamed += stream.push(id);
  streamed += stream.finish();
  if (streamed != decoded) {
    std::fprintf(stderr, "streamed decode differs from decode\n");
    std::abort();
  }
  return 0;
}
