#include "serve/utf8.h"

namespace dsv4::utf8 {
namespace {

// Valid second-byte range for a lead byte (Unicode Table 3-7); continuation bytes after the
// second are always 0x80..0xBF.
struct SecondByteRange {
  uint8_t low, high;
};

int sequence_length_for_lead(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

SecondByteRange second_byte_range(uint8_t lead) {
  if (lead == 0xE0) return {0xA0, 0xBF};
  if (lead == 0xED) return {0x80, 0x9F};
  if (lead == 0xF0) return {0x90, 0xBF};
  if (lead == 0xF4) return {0x80, 0x8F};
  return {0x80, 0xBF};
}

// How many bytes starting at pos agree with a valid sequence (1 = only the lead byte), and the
// sequence length the lead byte announces.
size_t matching_prefix(std::string_view text, size_t pos, int& needed) {
  const auto lead = static_cast<uint8_t>(text[pos]);
  needed = sequence_length_for_lead(lead);
  if (needed <= 1) return needed;
  size_t matched = 1;
  const SecondByteRange second = second_byte_range(lead);
  while (matched < static_cast<size_t>(needed) && pos + matched < text.size()) {
    const auto b = static_cast<uint8_t>(text[pos + matched]);
    const bool ok = matched == 1 ? (b >= second.low && b <= second.high) : (b >= 0x80 && b <= 0xBF);
    if (!ok) break;
    ++matched;
  }
  return matched;
}

}  // namespace

size_t valid_sequence_length(std::string_view text, size_t pos) {
  int needed = 0;
  const size_t matched = matching_prefix(text, pos, needed);
  return needed > 0 && matched == static_cast<size_t>(needed) ? matched : 0;
}

size_t maximal_subpart_length(std::string_view text, size_t pos) {
  int needed = 0;
  const size_t matched = matching_prefix(text, pos, needed);
  return matched == 0 ? 1 : matched;
}

bool is_valid(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t n = valid_sequence_length(text, pos);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

std::string repair(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t n = valid_sequence_length(text, pos);
    if (n > 0) {
      out.append(text.substr(pos, n));
      pos += n;
    } else {
      out.append(kReplacementChar);
      pos += maximal_subpart_length(text, pos);
    }
  }
  return out;
}

size_t incomplete_tail_length(std::string_view text) {
  // A sequence is at most 4 bytes, so only the last 3 bytes can start an unfinished one.
  const size_t first = text.size() > 3 ? text.size() - 3 : 0;
  for (size_t pos = first; pos < text.size(); ++pos) {
    const auto b = static_cast<uint8_t>(text[pos]);
    if (b < 0xC0) continue;  // ASCII or continuation byte: not a lead
    int needed = 0;
    const size_t matched = matching_prefix(text, pos, needed);
    const size_t available = text.size() - pos;
    if (needed > 1 && matched == available && available < static_cast<size_t>(needed)) return available;
  }
  return 0;
}

void append_code_point(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t next_code_point(std::string_view text, size_t& pos) {
  const auto lead = static_cast<uint8_t>(text[pos]);
  const int n = sequence_length_for_lead(lead);
  if (n <= 1) {
    ++pos;
    return lead;
  }
  uint32_t cp = lead & (0x7F >> n);
  for (int i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<uint8_t>(text[pos + i]) & 0x3F);
  pos += n;
  return cp;
}

}  // namespace dsv4::utf8
