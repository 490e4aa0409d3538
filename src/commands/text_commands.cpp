// `dsv4 tokenize` and `dsv4 detokenize`: the tokenizer from the command line, for checking ids
// against other implementations and for debugging prompts.
#include <fmt/format.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>

#include "commands/commands.h"
#include "core/error.h"
#include "serve/tokenizer.h"

namespace dsv4::commands {
namespace {

constexpr const char* kTokenizerHelp =
    "Directory holding tokenizer.json (or the file itself). Default: DeepSeek's tokenizer from "
    "tools/npm (installed by scripts/setup.sh) with the DeepSeek-V4 special tokens, or "
    "$DSV4_TOKENIZER_JSON";

Tokenizer load_tokenizer(const std::string& path) {
  return path.empty() ? Tokenizer::load_default() : Tokenizer::load(path);
}

std::string read_all(std::istream& in) {
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {}", path);
  return read_all(in);
}

// "1,2,3" (spaces, newlines and brackets tolerated, so a JSON list pastes in as it is).
std::vector<TokenId> parse_ids(std::string_view text) {
  std::vector<TokenId> ids;
  size_t pos = 0;
  auto is_separator = [](char c) { return c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '[' || c == ']'; };
  while (pos < text.size()) {
    if (is_separator(text[pos])) {
      ++pos;
      continue;
    }
    size_t end = pos;
    while (end < text.size() && !is_separator(text[end])) ++end;
    const std::string_view item = text.substr(pos, end - pos);
    int64_t value = 0;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (ec != std::errc() || ptr != item.data() + item.size() || value < 0 || value > INT32_MAX)
      fail("'{}' is not a token id (expected comma-separated non-negative integers)", item);
    ids.push_back(static_cast<TokenId>(value));
    pos = end;
  }
  return ids;
}

void add_tokenize(CLI::App& app) {
  struct Options {
    std::string tokenizer, text, file;
    bool have_text = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Print the token ids of a text, comma-separated on one line. The text alone is encoded: no "
      "BOS/EOS is added, and special-token strings inside it (<｜User｜>, <think>, ...) become "
      "their ids, as Hugging Face's tokenizer does. Invalid UTF-8 is replaced by U+FFFD. "
      "Reads TEXT, or --file, or standard input (all of it, trailing newline included).");
  cmd->add_option("--tokenizer", options->tokenizer, kTokenizerHelp);
  cmd->add_option("text", options->text, "Text to encode");
  cmd->add_option("--file", options->file, "Encode the bytes of this file")->check(CLI::ExistingFile);
  cmd->callback([options, cmd] {
    const bool have_text = cmd->count("text") > 0;
    if (have_text && !options->file.empty()) fail("give either TEXT or --file, not both");
    const std::string input = have_text ? options->text
                              : !options->file.empty() ? read_file(options->file)
                                                       : read_all(std::cin);
    const Tokenizer tokenizer = load_tokenizer(options->tokenizer);
    const std::vector<TokenId> ids = tokenizer.encode(input);
    fmt::print("{}\n", fmt::join(ids, ","));
  });
}

void add_detokenize(CLI::App& app) {
  struct Options {
    std::string tokenizer, ids;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "detokenize",
      "Print the text of comma-separated token ids (standard input when IDS is not given). The "
      "text is written exactly, with a newline added only when standard output is a terminal. "
      "An id outside the vocabulary is an error.");
  cmd->add_option("--tokenizer", options->tokenizer, kTokenizerHelp);
  cmd->add_option("ids", options->ids, "Token ids, e.g. 128803,30594,128804");
  cmd->callback([options, cmd] {
    const std::string text = cmd->count("ids") > 0 ? options->ids : read_all(std::cin);
    const std::vector<TokenId> ids = parse_ids(text);
    const Tokenizer tokenizer = load_tokenizer(options->tokenizer);
    const std::string decoded = tokenizer.decode(ids);
    std::fwrite(decoded.data(), 1, decoded.size(), stdout);
    if (isatty(fileno(stdout))) std::fputc('\n', stdout);
  });
}

}  // namespace

void add_text_commands(CLI::App& app) {
  add_tokenize(app);
  add_detokenize(app);
}

}  // namespace dsv4::commands
