// libFuzzer target: the output parser never crashes, and streaming the input in chunks (sizes
// taken from the input itself) gives exactly the whole-text parse with valid UTF-8 pieces.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "serve/chat_output_parser.h"
#include "serve/utf8.h"

namespace {

[[noreturn]] void fail_with(const char* what) {
  std::fprintf(stderr, "%s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  using dsv4::chat::OutputDelta;
  using dsv4::chat::OutputParser;
  const auto mode = data[0] & 1 ? dsv4::chat::ThinkingMode::Thinking : dsv4::chat::ThinkingMode::Chat;
  const unsigned chunk_seed = data[1];
  // Pieces of the vocabulary the parser reacts to make the fuzzer's job easier when spliced in.
  const std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);
  const OutputDelta whole = OutputParser::parse(text, mode);

  OutputParser parser(mode);
  OutputDelta streamed;
  size_t position = 0, step = 0;
  while (position < text.size()) {
    const size_t chunk = 1 + (chunk_seed * (step + 7) + step * step) % 13;
    OutputDelta piece = parser.push(text.substr(position, chunk));
    position += std::min(chunk, text.size() - position);
    ++step;
    if (dsv4::utf8::is_valid(text) && (!dsv4::utf8::is_valid(piece.content) || !dsv4::utf8::is_valid(piece.reasoning_content)))
      fail_with("a streamed piece is not valid UTF-8");
    streamed.append(std::move(piece));
  }
  streamed.append(parser.finish());
  if (streamed.content != whole.content) fail_with("streamed content differs");
  if (streamed.reasoning_content != whole.reasoning_content) fail_with("streamed reasoning differs");
  if (streamed.tool_calls.size() != whole.tool_calls.size()) fail_with("streamed tool calls differ");
  for (size_t i = 0; i < whole.tool_calls.size(); ++i)
    if (streamed.tool_calls[i].name != whole.tool_calls[i].name ||
        streamed.tool_calls[i].arguments != whole.tool_calls[i].arguments)
      fail_with("streamed tool call differs");
  return 0;
}
