// GET / (and /index.html): the chat page, chat_page.html embedded at build time
// (cmake/embed_file.cmake). It talks to /v1 from the browser, so it needs no key itself.
#include <httplib.h>

#include "serve/http/endpoints.h"

namespace dsv4::serve {

extern const unsigned char kChatPageHtml[];
extern const size_t kChatPageHtml_size;

namespace {

// The page is self-contained: the policy lets it reach only this server, so nothing it shows
// can load from or send to anywhere else.
constexpr const char* kContentSecurityPolicy =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

}  // namespace

void handle_chat_page(ServerContext&, const httplib::Request&, httplib::Response& res) {
  res.status = 200;
  res.set_header("Content-Security-Policy", kContentSecurityPolicy);
  res.set_header("Cache-Control", "no-cache");  // a rebuilt server serves its own page
  res.set_content(reinterpret_cast<const char*>(kChatPageHtml), kChatPageHtml_size, "text/html; charset=utf-8");
}

}  // namespace dsv4::serve
