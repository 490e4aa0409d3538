#include "serve/chat_output_parser.h"

#include <algorithm>
#include <array>

#include "serve/python_json.h"
#include "serve/utf8.h"

namespace dsv4::chat {
namespace {

const std::string kToolCallsOpen = "<" + std::string(kDsml) + "tool_calls";
const std::string kToolCallsClose = "</" + std::string(kDsml) + "tool_calls>";
const std::string kInvokeOpen = "<" + std::string(kDsml) + "invoke";
const std::string kInvokeClose = "</" + std::string(kDsml) + "invoke>";
const std::string kParameterOpen = "<" + std::string(kDsml) + "parameter";
const std::string kParameterClose = "</" + std::string(kDsml) + "parameter>";

// Length of the longest suffix of `text` that is a proper prefix of `marker`: those bytes may
// still become the marker.
size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  for (size_t length = std::min(text.size(), marker.size() - 1); length > 0; --length)
    if (text.substr(text.size() - length) == marker.substr(0, length)) return length;
  return 0;
}

struct MarkerHit {
  size_t position = std::string_view::npos;  // where the text before the marker ends
  size_t end = 0;                            // first byte after the marker
  int which = -1;
};

// Earliest of `markers` in `text` (the first listed wins a tie).
MarkerHit find_first(std::string_view text, std::initializer_list<std::string_view> markers) {
  MarkerHit hit;
  int index = 0;
  for (std::string_view marker : markers) {
    const size_t position = text.find(marker);
    if (position != std::string_view::npos && (hit.position == std::string_view::npos || position < hit.position))
      hit = {position, position + marker.size(), index};
    ++index;
  }
  return hit;
}

// The value of attribute `name="..."` in a DSML tag's text, or false when absent.
bool attribute(std::string_view tag, std::string_view name, std::string& value) {
  std::string key(" ");
  key.append(name).append("=\"");
  const size_t start = tag.find(key);
  if (start == std::string_view::npos) return false;
  const size_t value_start = start + key.size();
  const size_t end = tag.find('"', value_start);
  if (end == std::string_view::npos) return false;
  value = std::string(tag.substr(value_start, end - value_start));
  return true;
}

}  // namespace

void OutputDelta::append(OutputDelta&& other) {
  reasoning_content += other.reasoning_content;
  content += other.content;
  for (ToolCall& call : other.tool_calls) tool_calls.push_back(std::move(call));
}

OutputParser::OutputParser(ThinkingMode mode)
    : state_(mode == ThinkingMode::Thinking ? State::Reasoning : State::Content) {}

void OutputParser::emit_text(OutputDelta& delta, std::string_view text) const {
  (state_ == State::Reasoning ? delta.reasoning_content : delta.content) += text;
}

OutputDelta OutputParser::push(std::string_view text) {
  OutputDelta delta;
  if (state_ == State::Done) return delta;
  pending_ += text;
  step(delta, false);
  return delta;
}

OutputDelta OutputParser::finish() {
  OutputDelta delta;
  step(delta, true);
  if (state_ == State::ToolCalls) {
    if (error_.empty()) error_ = "the output ended inside a tool-calls block";
    state_ = State::Done;
  }
  pending_.clear();
  return delta;
}

OutputDelta OutputParser::parse(std::string_view text, ThinkingMode mode) {
  OutputParser parser(mode);
  OutputDelta result = parser.push(text);
  result.append(parser.finish());
  return result;
}

void OutputParser::step(OutputDelta& delta, bool final) {
  while (state_ != State::Done) {
    const std::string_view text = pending_;
    if (state_ == State::Reasoning || state_ == State::Content) {
      const MarkerHit hit = state_ == State::Reasoning ? find_first(text, {kThinkEnd, kEos})
                                                       : find_first(text, {kToolCallsOpen, kEos});
      if (hit.position != std::string_view::npos) {
        size_t text_end = hit.position;
        // The "\n\n" that introduces a tool-calls block is part of the markup.
        const bool opens_tool_calls = state_ == State::Content && hit.which == 0;
        for (int newlines = 0; opens_tool_calls && newlines < 2 && text_end > 0 && text[text_end - 1] == '\n'; ++newlines)
          --text_end;
        emit_text(delta, text.substr(0, text_end));
        const bool is_eos = (state_ == State::Reasoning && hit.which == 1) || (state_ == State::Content && hit.which == 1);
        state_ = is_eos ? State::Done : state_ == State::Reasoning ? State::Content : State::ToolCalls;
        // The tool-calls opener's '>' (and what follows) is consumed by the ToolCalls state.
        pending_.erase(0, hit.end);
        continue;
      }
      size_t hold = 0;
      if (!final) {
        const std::array<std::string_view, 2> markers =
            state_ == State::Reasoning ? std::array<std::string_view, 2>{kThinkEnd, kEos}
                                       : std::array<std::string_view, 2>{kToolCallsOpen, kEos};
        for (std::string_view marker : markers) hold = std::max(hold, partial_marker_suffix(text, marker));
        if (state_ == State::Content) {
          // Newlines right before a possible tool-calls opener may belong to it.
          size_t newlines = 0;
          while (newlines < 2 && hold + newlines < text.size() && text[text.size() - hold - newlines - 1] == '\n') ++newlines;
          if (hold > 0 || newlines > 0) hold += newlines;
        }
        hold = std::max(hold, utf8::incomplete_tail_length(text));
      }
      emit_text(delta, text.substr(0, text.size() - hold));
      pending_.erase(0, text.size() - hold);
      return;
    }
    // ToolCalls: complete invokes are parsed as soon as their closing tag arrives.
    const MarkerHit hit = find_first(text, {kInvokeClose, kToolCallsClose, kEos});
    if (hit.position == std::string_view::npos) return;  // wait for more (finish() reports)
    if (hit.which != 0 && text.substr(0, hit.position).find(kInvokeOpen) != std::string_view::npos && error_.empty())
      error_ = "a tool call is not terminated";
    if (hit.which == 2) {
      if (error_.empty()) error_ = "the output ended inside a tool-calls block";
      state_ = State::Done;
    } else if (hit.which == 0) {
      const size_t open = text.find(kInvokeOpen);
      if (open == std::string_view::npos || open > hit.position) {
        if (error_.empty()) error_ = "a tool call closes without opening";
      } else {
        parse_invoke(text.substr(open, hit.end - open), delta);
      }
    } else if (hit.which == 1) {
      state_ = State::Content;
    }
    pending_.erase(0, hit.end);
  }
}

// One `<｜DSML｜invoke name="...">` ... `</｜DSML｜invoke>`; arguments become a JSON object in
// DeepSeek's spelling: string parameters JSON-quoted, others inserted verbatim.
void OutputParser::parse_invoke(std::string_view invoke, OutputDelta& delta) {
  const size_t tag_end = invoke.find('>');
  ToolCall call;
  if (tag_end == std::string_view::npos || !attribute(invoke.substr(0, tag_end), "name", call.name)) {
    if (error_.empty()) error_ = "a tool call has no name";
    return;
  }
  std::string arguments = "{";
  size_t position = tag_end + 1;
  while (true) {
    const size_t open = invoke.find(kParameterOpen, position);
    if (open == std::string_view::npos) break;
    const size_t open_end = invoke.find('>', open);
    const size_t close = open_end == std::string_view::npos ? open_end : invoke.find(kParameterClose, open_end);
    std::string name, is_string;
    if (close == std::string_view::npos || !attribute(invoke.substr(open, open_end - open), "name", name) ||
        !attribute(invoke.substr(open, open_end - open), "string", is_string)) {
      if (error_.empty()) error_ = "a tool-call parameter is malformed";
      break;
    }
    const std::string_view value = invoke.substr(open_end + 1, close - open_end - 1);
    if (arguments.size() > 1) arguments += ", ";
    arguments += python_json_string(name) + ": " + (is_string == "true" ? python_json_string(value) : std::string(value));
    position = close + kParameterClose.size();
  }
  call.arguments = arguments + "}";
  delta.tool_calls.push_back(std::move(call));
}

}  // namespace dsv4::chat
