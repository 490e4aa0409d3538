// The dsv4 binary on a pseudo-terminal, driven like a user at a keyboard: keys in, the screen's
// bytes out, Ctrl-C through the terminal's line discipline (so SIGINT reaches the process as from
// a real terminal). Every wait is bounded; the destructor kills a process still running.
#pragma once
#include <chrono>
#include <string>

#include <sys/types.h>

namespace dsv4::test {

class PtySession {
 public:
  // Runs `dsv4 <args>` (a shell command line fragment) with TERM=dumb, so no styling codes.
  explicit PtySession(const std::string& args);
  ~PtySession();
  PtySession(const PtySession&) = delete;
  PtySession& operator=(const PtySession&) = delete;

  void send(const std::string& keys);     // as typed ("hello\r" ends a line)
  void interrupt() { send("\x03"); }      // Ctrl-C
  void end_of_input() { send("\x04"); }   // Ctrl-D on an empty line

  // Reads until `text` appears at or after `from` in the output; false after `timeout`.
  bool wait_for(const std::string& text, size_t from = 0, std::chrono::seconds timeout = std::chrono::seconds(60));
  // Reads until the output holds at least `n` bytes; false after `timeout`.
  bool wait_for_size(size_t n, std::chrono::seconds timeout = std::chrono::seconds(60));
  // Waits for the process to end; its exit status, or -1 after `timeout` (or a signal's end).
  int wait_exit(std::chrono::seconds timeout = std::chrono::seconds(60));

  const std::string& output() const { return output_; }  // everything the terminal showed so far
  size_t size() const { return output_.size(); }

 private:
  long read_some(int timeout_ms);  // bytes read, 0 after the timeout, -1 once the terminal is closed
  pid_t pid_ = -1;
  int master_ = -1;
  bool exited_ = false;
  int status_ = -1;
  std::string output_;
};

}  // namespace dsv4::test
