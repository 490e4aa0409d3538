// Whether the client of a request is still there. A client that drops its connection while its
// request waits in the queue or generates without writing (a non-streaming response) must be
// noticed at once, so the engine request is cancelled and its cache pages freed; a streaming
// response also notices it when a write fails, but only once there is something to write.
//
// cpp-httplib 0.11 (Debian 12) gives handlers neither the socket nor a "connection closed"
// query (later versions have Request::is_connection_closed), so the socket is found by its
// endpoints: the one open socket whose local and peer addresses are the request's. The socket
// stays open, and so the descriptor stays this connection's, until the handler returns.
#pragma once
#include <string>

namespace httplib {
struct Request;
}

namespace dsv4::serve {

class ClientConnection {
 public:
  explicit ClientConnection(const httplib::Request& request);
  // The endpoints alone (tests): local and peer address and port.
  ClientConnection(const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port);

  // True once the peer has closed or reset the connection. A connection whose socket could not be
  // found is never reported gone (the writes still notice a disconnect).
  bool gone() const;
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace dsv4::serve
