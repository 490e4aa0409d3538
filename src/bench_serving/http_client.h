// A blocking HTTP/1.1 client for one connection (cpp-httplib underneath, kept out of this header),
// reused across requests (keep-alive). Not thread-safe: each benchmark worker owns one.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace dsv4::bench_serving {

// "http://host:port[/prefix]" (https too): what the client connects to, and the path prefix every
// endpoint is appended to. Throws dsv4::Error on anything else.
struct BaseUrl {
  std::string origin;       // scheme://host:port
  std::string path_prefix;  // "" or "/prefix" (no trailing slash)
  std::string text;         // as given, without a trailing slash
};
BaseUrl parse_base_url(const std::string& url);

struct HttpOptions {
  double read_timeout_s = 3600;    // longest silence on an open request before it fails
  double connect_timeout_s = 10;
  std::string api_key;             // sent as "Authorization: Bearer KEY" when set
};

struct HttpReply {
  int status = 0;           // 0 when no response came
  std::string body;
  std::string error;        // transport failure ("" when a response came)
};

class HttpClient {
 public:
  HttpClient(const BaseUrl& base, const HttpOptions& options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  HttpReply get(const std::string& endpoint);
  // POSTs a JSON body and hands the response body over piece by piece as it arrives (on_body
  // returns false to stop reading). Returns the status and the transport error, body empty.
  HttpReply post_streaming(const std::string& endpoint, const std::string& json_body,
                           const std::function<bool(int status, std::string_view piece)>& on_body);

  const BaseUrl& base() const { return base_; }

 private:
  struct Impl;
  BaseUrl base_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4::bench_serving
