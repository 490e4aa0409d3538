#define PCRE2_CODE_UNIT_WIDTH 8
#include "serve/pretokenizer.h"

#include <fmt/core.h>
#include <pcre2.h>

#include "core/error.h"
#include "serve/unicode_patch.h"

namespace dsv4 {
namespace {

// Unicode White_Space, the set Oniguruma's `\s` matches (written as class content).
constexpr std::string_view kWhiteSpaceClass =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

// Class content for \p{X} plus the code points Hugging Face's engine assigns to X that PCRE2's
// tables do not (unicode_patch.h).
std::string property_class_content(std::string_view property) {
  std::string content = fmt::format("\\p{{{}}}", property);
  for (const UnicodePatchRange& r : kUnicodePatch) {
    if (property != r.property) continue;
    content += r.first == r.last ? fmt::format("\\x{{{:X}}}", r.first)
                                 : fmt::format("\\x{{{:X}}}-\\x{{{:X}}}", r.first, r.last);
  }
  return content;
}

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

std::string oniguruma_to_pcre2(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '\\') {
      DSV4_CHECK(i + 1 < pattern.size(), "pre-tokenizer pattern ends with a lone backslash: {}", pattern);
      const char escaped = pattern[i + 1];
      if (escaped == 's' || escaped == 'S') {
        DSV4_CHECK(!(in_class && escaped == 'S'), "pre-tokenizer pattern uses \\S inside a class: {}", pattern);
        if (in_class) out += kWhiteSpaceClass;
        else out += (escaped == 's' ? "[" : "[^") + std::string(kWhiteSpaceClass) + "]";
        i += 2;
        continue;
      }
      if ((escaped == 'p' || escaped == 'P') && i + 2 < pattern.size() && pattern[i + 2] == '{') {
        const size_t close = pattern.find('}', i);
        DSV4_CHECK(close != std::string_view::npos, "unterminated \\p{{...}} in pre-tokenizer pattern: {}", pattern);
        const std::string_view property = pattern.substr(i + 3, close - i - 3);
        const std::string content = property_class_content(property);
        if (escaped == 'p') {
          out += in_class ? content : "[" + content + "]";
        } else {
          DSV4_CHECK(!in_class, "pre-tokenizer pattern uses \\P{{...}} inside a class: {}", pattern);
          out += "[^" + content + "]";
        }
        i = close + 1;
        continue;
      }
      out.append(pattern.substr(i, 2));
      i += 2;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      ++i;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i < pattern.size() && pattern[i] == '^') out += pattern[i++];
      if (i < pattern.size() && pattern[i] == ']') out += pattern[i++];
      continue;
    }
    if (c == '[' && in_class) fail("nested character classes are not supported in pre-tokenizer patterns: {}", pattern);
    if (c == ']' && in_class) in_class = false;
    out += c;
    ++i;
  }
  DSV4_CHECK(!in_class, "unterminated character class in pre-tokenizer pattern: {}", pattern);
  return out;
}

struct PreTokenizer::CompiledPattern {
  std::string source;
  pcre2_code* code = nullptr;
  ~CompiledPattern() { pcre2_code_free(code); }
};

class PreTokenizer::Scratch {
 public:
  Scratch() {
    match_data = pcre2_match_data_create(1, nullptr);
    match_context = pcre2_match_context_create(nullptr);
    // Greedy repeats over long runs (a megabyte of spaces) need more than the default 32 KiB.
    jit_stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
    if (!match_data || !match_context || !jit_stack) fail("out of memory creating PCRE2 match state");
    pcre2_jit_stack_assign(match_context, nullptr, jit_stack);
  }
  ~Scratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(match_context);
    pcre2_match_data_free(match_data);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* match_context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  std::vector<std::string_view> level_a, level_b;
};

PreTokenizer::PreTokenizer(const std::vector<std::string>& patterns) {
  for (const std::string& pattern : patterns) {
    auto compiled = std::make_unique<CompiledPattern>();
    compiled->source = oniguruma_to_pcre2(pattern);
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    compiled->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled->source.data()), compiled->source.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
    if (!compiled->code) {
      fail("pre-tokenizer pattern does not compile with PCRE2 ({} at offset {}): {}", pcre2_error_text(error_code),
           error_offset, compiled->source);
    }
    // JIT is an optimisation: where the platform lacks it, pcre2_match interprets.
    pcre2_jit_compile(compiled->code, PCRE2_JIT_COMPLETE);
    patterns_.push_back(std::move(compiled));
  }
}

PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

PreTokenizer::ScratchPtr PreTokenizer::make_scratch() const { return ScratchPtr(new Scratch()); }
void PreTokenizer::ScratchDeleter::operator()(Scratch* scratch) const { delete scratch; }

const std::string& PreTokenizer::compiled_pattern(size_t index) const { return patterns_.at(index)->source; }
size_t PreTokenizer::pattern_count() const { return patterns_.size(); }

void PreTokenizer::split(std::string_view text, Scratch& scratch, std::vector<std::string_view>& pieces) const {
  if (text.empty()) return;
  std::vector<std::string_view>* current = &scratch.level_a;
  std::vector<std::string_view>* next = &scratch.level_b;
  current->clear();
  current->push_back(text);
  for (const auto& pattern : patterns_) {
    next->clear();
    for (std::string_view piece : *current) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t gap_start = 0, offset = 0;
      while (offset < piece.size()) {
        const int rc = pcre2_match(pattern->code, subject, piece.size(), offset, PCRE2_NO_UTF_CHECK,
                                   scratch.match_data, scratch.match_context);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) fail("pre-tokenizer regex failed on a {}-byte piece: {}", piece.size(), pcre2_error_text(rc));
        const PCRE2_SIZE* span = pcre2_get_ovector_pointer(scratch.match_data);
        const size_t start = span[0], end = span[1];
        if (end == start) {
          // An empty match splits nothing (Hugging Face drops empty pieces); step one character.
          offset = start + 1;
          while (offset < piece.size() && (static_cast<unsigned char>(piece[offset]) & 0xC0) == 0x80) ++offset;
          continue;
        }
        if (start > gap_start) next->push_back(piece.substr(gap_start, start - gap_start));
        next->push_back(piece.substr(start, end - start));
        gap_start = offset = end;
      }
      if (gap_start < piece.size()) next->push_back(piece.substr(gap_start));
    }
    std::swap(current, next);
  }
  pieces.insert(pieces.end(), current->begin(), current->end());
}

}  // namespace dsv4
