#include "bench_serving/http_client.h"

#include <httplib.h>

#include <cmath>

#include "core/error.h"

namespace dsv4::bench_serving {

BaseUrl parse_base_url(const std::string& url) {
  BaseUrl b;
  b.text = url;
  while (!b.text.empty() && b.text.back() == '/') b.text.pop_back();
  const size_t scheme_end = b.text.find("://");
  if (scheme_end == std::string::npos) fail("--base-url '{}': expected http://HOST:PORT", url);
  const std::string scheme = b.text.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https") fail("--base-url '{}': only http:// and https:// are supported", url);
  const size_t path_start = b.text.find('/', scheme_end + 3);
  b.origin = b.text.substr(0, path_start);
  if (path_start != std::string::npos) b.path_prefix = b.text.substr(path_start);
  if (b.origin.size() <= scheme_end + 3) fail("--base-url '{}': no host", url);
  return b;
}

namespace {

// cpp-httplib names its errors in one word ("Read"); say what happened.
std::string describe(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection: return "connection refused or host unreachable";
    case httplib::Error::ConnectionTimeout: return "connection timed out";
    case httplib::Error::Read: return "the connection broke or timed out while reading the response";
    case httplib::Error::Write: return "the connection broke while sending the request";
    case httplib::Error::SSLConnection: return "TLS handshake failed";
    case httplib::Error::SSLServerVerification: return "the server's TLS certificate was not accepted";
    default: return httplib::to_string(e);
  }
}

}  // namespace

struct HttpClient::Impl {
  explicit Impl(const std::string& origin) : client(origin) {}
  httplib::Client client;
  httplib::Headers headers;
};

namespace {
void set_timeout(const std::function<void(time_t, time_t)>& set, double seconds) {
  const double whole = std::floor(seconds);
  set(time_t(whole), time_t((seconds - whole) * 1e6));
}
}  // namespace

HttpClient::HttpClient(const BaseUrl& base, const HttpOptions& options) : base_(base), impl_(std::make_unique<Impl>(base.origin)) {
  auto& c = impl_->client;
  c.set_keep_alive(true);
  c.set_tcp_nodelay(true);
  set_timeout([&](time_t s, time_t us) { c.set_read_timeout(s, us); }, options.read_timeout_s);
  set_timeout([&](time_t s, time_t us) { c.set_connection_timeout(s, us); }, options.connect_timeout_s);
  set_timeout([&](time_t s, time_t us) { c.set_write_timeout(s, us); }, options.connect_timeout_s);
  if (!options.api_key.empty()) impl_->headers.emplace("Authorization", "Bearer " + options.api_key);
}

HttpClient::~HttpClient() = default;

HttpReply HttpClient::get(const std::string& endpoint) {
  HttpReply r;
  auto res = impl_->client.Get((base_.path_prefix + endpoint).c_str(), impl_->headers);
  if (!res) {
    r.error = describe(res.error());
    return r;
  }
  r.status = res->status;
  r.body = res->body;
  return r;
}

HttpReply HttpClient::post_streaming(const std::string& endpoint, const std::string& json_body,
                                     const std::function<bool(int, std::string_view)>& on_body) {
  HttpReply r;
  httplib::Request req;
  req.method = "POST";
  req.path = base_.path_prefix + endpoint;
  req.headers = impl_->headers;
  req.headers.emplace("Content-Type", "application/json");
  req.headers.emplace("Accept", "text/event-stream");
  req.body = json_body;
  req.response_handler = [&](const httplib::Response& res) {
    r.status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) { return on_body(r.status, {data, n}); };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  if (!impl_->client.send(req, res, err) && err != httplib::Error::Canceled) r.error = describe(err);
  if (r.status == 0) r.status = res.status > 0 ? res.status : 0;
  return r;
}

}  // namespace dsv4::bench_serving
