// `dsv4 tokenize` and `dsv4 detokenize`: the tokenizer from the command line, for checking ids
// against other implementations and for debugging prompts.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>

#include "checkpoint/model_config.h"
#include "commands/cli_options.h"
#include "commands/commands.h"
#include "core/error.h"
#include "serve/tokenizer.h"

namespace dsv4::commands {
namespace {

constexpr const char* kTokenizerHelp =
    "Directory holding tokenizer.json (or the file itself). Default: DeepSeek's tokenizer from "
    "tools/npm (installed by scripts/setup.sh) with the DeepSeek-V4 special tokens, or "
    "$DSV4_TOKENIZER_JSON";

// Where the tokenizer comes from: --tokenizer PATH, --model DIR (its tokenizer.json), or the default.
struct TokenizerSource {
  std::string tokenizer, model;
  void add_options(CLI::App* cmd) {
    auto* by_path = cmd->add_option("--tokenizer", tokenizer, kTokenizerHelp);
    cmd->add_option("--model", model, "Use the tokenizer.json of this checkpoint directory")->excludes(by_path);
  }
  Tokenizer load() const {
    if (!model.empty()) {
      check_model_dir(model);
      if (!std::filesystem::exists(std::filesystem::path(model) / "tokenizer.json"))
        fail("--model {} has no tokenizer.json", model);
      return Tokenizer::load(model);
    }
    return tokenizer.empty() ? Tokenizer::load_default() : Tokenizer::load(tokenizer);
  }
};

std::string read_all(std::istream& in) {
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {}", path);
  return read_all(in);
}

void add_tokenize(CLI::App& app) {
  struct Options {
    TokenizerSource source;
    std::string text, file;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Print the token ids of a text, comma-separated on one line. The text alone is encoded: no "
      "BOS/EOS is added, and special-token strings inside it (<｜User｜>, <think>, ...) become "
      "their ids, as Hugging Face's tokenizer does. Invalid UTF-8 is replaced by U+FFFD. "
      "Reads TEXT, or --file, or standard input (all of it, trailing newline included).");
  options->source.add_options(cmd);
  cmd->add_option("text", options->text, "Text to encode");
  cmd->add_option("--file", options->file, "Encode the bytes of this file")->check(CLI::ExistingFile);
  cmd->callback([options, cmd] {
    const bool have_text = cmd->count("text") > 0;
    if (have_text && !options->file.empty()) usage_error("give either TEXT or --file, not both");
    const std::string input = have_text ? options->text
                              : !options->file.empty() ? read_file(options->file)
                                                       : read_all(std::cin);
    const Tokenizer tokenizer = options->source.load();
    const std::vector<TokenId> ids = tokenizer.encode(input);
    fmt::print("{}\n", fmt::join(ids, ","));
  });
}

void add_detokenize(CLI::App& app) {
  struct Options {
    TokenizerSource source;
    std::string ids;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "detokenize",
      "Print the text of token ids (standard input when IDS is not given). The text is written "
      "exactly, with a newline added only when standard output is a terminal.");
  options->source.add_options(cmd);
  cmd->add_option("ids", options->ids, "Token ids, e.g. 128803,30594,128804");
  cmd->footer(fmt::format(
      "Token ids: non-negative integers separated by one comma or by spaces, optionally inside [ ]\n"
      "(\"1,,2\" is an error). Valid ids are those below the vocabulary size: the model's with\n"
      "--model, else DeepSeek-V4's ({}). A valid id the tokenizer has no text for (the embedding's\n"
      "padding rows, 128846 and up with DeepSeek's tokenizer) is printed as <id:N>, as generate and\n"
      "chat do; an id past the vocabulary is an error.\n",
      kDeepSeekV4VocabSize));
  cmd->callback([options, cmd] {
    const bool from_argument = cmd->count("ids") > 0;
    const std::string text = from_argument ? options->ids : read_all(std::cin);
    std::vector<TokenId> ids;
    try {
      ids = parse_token_ids(text, from_argument ? "IDS" : "standard input", true);
    } catch (const Error& e) {
      if (from_argument) usage_error("{}", e.what());
      throw;
    }
    const Tokenizer tokenizer = options->source.load();
    const int64_t limit = !options->source.model.empty() ? int64_t(load_model_config(options->source.model).vocab_size)
                                                         : std::max<int64_t>(kDeepSeekV4VocabSize, int64_t(tokenizer.id_limit()));
    for (TokenId id : ids)
      if (id >= limit) fail("token id {} is outside the vocabulary (ids below {})", id, limit);
    const std::string decoded = decode_with_markers(tokenizer, ids);
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
