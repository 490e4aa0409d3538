#include "pty_session.h"

#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "test_util.h"

namespace dsv4::test {

using Clock = std::chrono::steady_clock;

PtySession::PtySession(const std::string& args) {
  struct winsize size {};
  size.ws_row = 50;
  size.ws_col = 200;
  const std::string command = "exec " + dsv4_binary() + " " + args;
  pid_ = forkpty(&master_, nullptr, nullptr, &size);
  if (pid_ < 0) throw std::runtime_error("forkpty failed");
  if (pid_ == 0) {
    setenv("TERM", "dumb", 1);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
}

PtySession::~PtySession() {
  if (!exited_ && pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (master_ >= 0) close(master_);
}

void PtySession::send(const std::string& keys) {
  for (char c : keys) {
    if (write(master_, &c, 1) != 1) throw std::runtime_error("cannot write to the terminal");
    // One key at a time, as typed: a Ctrl-C in the middle of a burst must act where it stands.
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

long PtySession::read_some(int timeout_ms) {
  struct pollfd fd {master_, POLLIN, 0};
  const int ready = poll(&fd, 1, timeout_ms);
  if (ready == 0 || (ready < 0 && errno == EINTR)) return 0;
  if (ready < 0) return -1;
  char buffer[4096];
  const ssize_t n = read(master_, buffer, sizeof buffer);
  if (n <= 0) return -1;  // EIO: the process closed the terminal
  output_.append(buffer, size_t(n));
  return long(n);
}

bool PtySession::wait_for(const std::string& text, size_t from, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto found = [&] { return output_.find(text, std::min(from, output_.size())) != std::string::npos; };
  while (!found()) {
    if (Clock::now() > deadline || read_some(100) < 0) return found();
  }
  return true;
}

bool PtySession::wait_for_size(size_t n, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (output_.size() < n) {
    if (Clock::now() > deadline || read_some(100) < 0) return output_.size() >= n;
  }
  return true;
}

int PtySession::wait_exit(std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!exited_) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      break;
    }
    if (Clock::now() > deadline) return -1;
    if (read_some(50) < 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  while (read_some(0) > 0) {  // what the process wrote last
  }
  return status_;
}

}  // namespace dsv4::test
