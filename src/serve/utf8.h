// UTF-8 helpers shared by the tokenizer, the streaming detokenizer and the chat output parser.
// Invalid input is repaired the way Rust's String::from_utf8_lossy (and so Hugging Face's decoder)
// does it: every maximal invalid subpart becomes one U+FFFD, so our text matches the reference
// library byte for byte even on broken input.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsv4::utf8 {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length of the valid UTF-8 sequence starting at text[pos], or 0 when the bytes there are not a
// complete, valid sequence (overlong forms, surrogates and values above U+10FFFF are invalid).
size_t valid_sequence_length(std::string_view text, size_t pos);

// Length of the longest prefix of text[pos..] that could still become a valid sequence if more
// bytes followed (the "maximal subpart" of Unicode §3.9); at least 1 for any invalid byte.
size_t maximal_subpart_length(std::string_view text, size_t pos);

bool is_valid(std::string_view text);

// Copy of text with every maximal invalid subpart replaced by U+FFFD.
std::string repair(std::string_view text);

// Number of bytes at the end of text that form an incomplete (but so far valid) sequence, which a
// streaming decoder must hold back until the next token completes it. 0 when text ends cleanly.
size_t incomplete_tail_length(std::string_view text);

// Appends the UTF-8 encoding of a Unicode scalar value.
void append_code_point(std::string& out, uint32_t cp);

// Decodes the (valid) sequence at text[pos]; returns its code point and advances pos.
uint32_t next_code_point(std::string_view text, size_t& pos);

}  // namespace dsv4::utf8
