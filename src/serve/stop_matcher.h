// Stop strings across token boundaries. Text deltas are fed as they are detokenized; each push
// returns the text that is safe to emit now. A suffix that could be the start of a stop string is
// held back until the next push settles it; when a stop string completes, the text before it is
// returned, the stop string itself is not (as OpenAI does) and everything after it is dropped.
// The earliest match in the text wins. Stop strings are UTF-8, so a held-back suffix always
// starts on a character boundary and the emitted text never splits a character.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace dsv4::openai {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);  // empty strings are ignored

  struct Result {
    std::string text;     // safe to emit now
    bool stopped = false;  // a stop string matched; push no more
    std::string matched;   // which one
  };

  Result push(std::string_view delta);
  // Generation ended for another reason: releases the held-back text.
  std::string finish();

  bool stopped() const { return stopped_; }
  bool active() const { return !stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // received, not yet emitted: always shorter than the longest stop string
  bool stopped_ = false;
};

}  // namespace dsv4::openai
