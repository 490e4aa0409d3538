// The pre-tokenizer of a byte-level BPE tokenizer.json: a sequence of `Split` regexes with the
// Isolated behaviour (matches and the gaps between them both become pieces; each later regex runs
// on each piece of the earlier one, seeing only that piece), compiled with PCRE2 in UTF + UCP mode
// and JIT-compiled where PCRE2 supports it.
//
// The patterns in tokenizer.json are written for the Oniguruma engine inside Hugging Face's
// library. Two of its notions differ from PCRE2's and are rewritten before compiling:
//   - `\s` is Unicode White_Space in Oniguruma (it includes U+0085, PCRE2 10.42's does not);
//   - Oniguruma's Unicode tables are newer than Debian's PCRE2 (Unicode 14), so \p{L}, \p{N},
//     \p{P} gain the code points assigned since (found by scripts/tokenizer/unicode_classes.mjs
//     and checked for every code point by tests/serve/tokenizer_unicode_test.cpp).
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

class PreTokenizer {
 public:
  // `patterns` in Oniguruma syntax, applied in order. Throws dsv4::Error on a pattern PCRE2
  // cannot compile or one that uses a construct the rewrite does not handle.
  explicit PreTokenizer(const std::vector<std::string>& patterns);
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  // Matching state (PCRE2 match data, JIT stack, piece buffers), independent of the patterns:
  // one per thread serves every PreTokenizer. Reuse it across calls to avoid allocations.
  class Scratch;
  struct ScratchDeleter {
    void operator()(Scratch* scratch) const;
  };
  using ScratchPtr = std::unique_ptr<Scratch, ScratchDeleter>;
  ScratchPtr make_scratch() const;

  // Splits valid UTF-8 `text` into pieces (views into `text`), appended to `pieces`.
  void split(std::string_view text, Scratch& scratch, std::vector<std::string_view>& pieces) const;

  // The pattern as handed to PCRE2 (after the Oniguruma rewrite); for diagnostics and tests.
  const std::string& compiled_pattern(size_t index) const;
  size_t pattern_count() const;

 private:
  struct CompiledPattern;
  std::vector<std::unique_ptr<CompiledPattern>> patterns_;
};

// Rewrites an Oniguruma pattern into an equivalent PCRE2 pattern (see the header comment).
std::string oniguruma_to_pcre2(std::string_view pattern);

}  // namespace dsv4
