// Shared by the tokenizer tests: the default tokenizer, loaded once per test binary.
#pragma once
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "serve/tokenizer.h"

namespace dsv4::testing {

inline const Tokenizer& default_tokenizer() {
  static const Tokenizer tokenizer = Tokenizer::load_default();
  return tokenizer;
}

inline std::string read_test_file(const std::string& relative) {
  const std::string path = std::string(DSV4_TEST_DATA) + "/" + relative;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace dsv4::testing
