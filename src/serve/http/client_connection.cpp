#include "serve/http/client_connection.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <httplib.h>

namespace dsv4::serve {
namespace {

// The numeric host and port of a socket address, formatted as cpp-httplib formats
// Request::remote_addr / local_addr (getnameinfo with NI_NUMERICHOST).
bool endpoint_of(const sockaddr_storage& address, socklen_t length, std::string& host, int& port) {
  char host_text[NI_MAXHOST], port_text[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, host_text, sizeof host_text, port_text, sizeof port_text,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  host = host_text;
  port = std::atoi(port_text);
  return true;
}

bool is_connection(int fd, const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  std::string host;
  int port = -1;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return false;
  if (!endpoint_of(address, length, host, port) || port != remote_port || host != remote_addr) return false;
  length = sizeof address;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return false;
  return endpoint_of(address, length, host, port) && port == local_port && host == local_addr;
}

int find_socket(const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port) {
  if (local_port < 0 || remote_port < 0) return -1;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    if (is_connection(int(fd), local_addr, local_port, remote_addr, remote_port)) {
      found = int(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

}  // namespace

ClientConnection::ClientConnection(const httplib::Request& request)
    : ClientConnection(request.local_addr, request.local_port, request.remote_addr, request.remote_port) {}

ClientConnection::ClientConnection(const std::string& local_addr, int local_port, const std::string& remote_addr,
                                   int remote_port)
    : fd_(find_socket(local_addr, local_port, remote_addr, remote_port)) {}

bool ClientConnection::gone() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  // POLLRDHUP: the peer sent FIN (HTTP clients do not half-close, so it has gone); POLLHUP /
  // POLLERR: reset or fully closed.
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace dsv4::serve
