// A strict little XML parser for the tests: accepts only well-formed documents (one root, nested
// tags, quoted attributes, known or numeric entities, comments and an XML declaration) and returns
// the element tree, or throws std::runtime_error saying where the document is broken.
#pragma once
#include <cctype>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace dsv4::test {

struct XmlElement {
  std::string name;
  std::map<std::string, std::string> attributes;
  std::vector<XmlElement> children;
  std::string text;
  // Every element named `name` in this subtree, this one included.
  void find_all(const std::string& n, std::vector<const XmlElement*>& out) const {
    if (name == n) out.push_back(this);
    for (auto& c : children) c.find_all(n, out);
  }
};

class XmlParser {
 public:
  explicit XmlParser(const std::string& doc) : s_(doc) {}

  XmlElement parse() {
    skip_space();
    if (starts("<?xml")) skip_past("?>");
    skip_misc();
    XmlElement root = element();
    skip_misc();
    if (i_ != s_.size()) error("content after the root element");
    return root;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    throw std::runtime_error("XML: " + what + " at offset " + std::to_string(i_));
  }
  bool starts(const char* p) const { return s_.compare(i_, std::char_traits<char>::length(p), p) == 0; }
  void skip_space() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  void skip_past(const char* end) {
    size_t at = s_.find(end, i_);
    if (at == std::string::npos) error(std::string("missing ") + end);
    i_ = at + std::char_traits<char>::length(end);
  }
  void skip_misc() {
    for (skip_space(); starts("<!--"); skip_space()) skip_past("-->");
  }
  std::string name() {
    size_t b = i_;
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '-' || s_[i_] == '_' ||
                              s_[i_] == ':' || s_[i_] == '.'))
      ++i_;
    if (b == i_ || std::isdigit(static_cast<unsigned char>(s_[b]))) error("bad name");
    return s_.substr(b, i_ - b);
  }
  std::string chars(char stop) {  // text up to `stop` with entities decoded
    std::string out;
    while (i_ < s_.size() && s_[i_] != stop) {
      if (s_[i_] == '<' && stop != '<') error("'<' in an attribute value");
      if (s_[i_] == '&') {
        size_t semi = s_.find(';', i_);
        if (semi == std::string::npos) error("unterminated entity");
        std::string e = s_.substr(i_ + 1, semi - i_ - 1);
        static const std::map<std::string, char> known = {{"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}};
        if (known.count(e)) out += known.at(e);
        else if (e.size() > 1 && e[0] == '#') out += '?';
        else error("unknown entity &" + e + ";");
        i_ = semi + 1;
      } else {
        out += s_[i_++];
      }
    }
    return out;
  }
  XmlElement element() {
    if (!starts("<")) error("expected an element");
    ++i_;
    XmlElement e;
    e.name = name();
    for (;;) {
      skip_space();
      if (starts("/>")) {
        i_ += 2;
        return e;
      }
      if (starts(">")) {
        ++i_;
        break;
      }
      std::string attr = name();
      skip_space();
      if (!starts("=")) error("attribute without '='");
      ++i_;
      skip_space();
      if (i_ >= s_.size() || (s_[i_] != '"' && s_[i_] != '\'')) error("unquoted attribute value");
      const char quote = s_[i_++];
      std::string value = chars(quote);
      if (i_ >= s_.size()) error("unterminated attribute value");
      ++i_;
      if (!e.attributes.emplace(attr, value).second) error("duplicate attribute " + attr);
    }
    for (;;) {
      e.text += chars('<');
      if (i_ >= s_.size()) error("unclosed element <" + e.name + ">");
      if (starts("<!--")) {
        skip_past("-->");
      } else if (starts("</")) {
        i_ += 2;
        if (name() != e.name) error("mismatched closing tag for <" + e.name + ">");
        skip_space();
        if (!starts(">")) error("bad closing tag");
        ++i_;
        return e;
      } else {
        e.children.push_back(element());
      }
    }
  }
  const std::string& s_;
  size_t i_ = 0;
};

}  // namespace dsv4::test
