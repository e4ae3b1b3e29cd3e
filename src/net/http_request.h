// The HTTP side of the egress proxy: the request head a client sends to a
// forward proxy, parsed with Boost.Beast, and the responses the proxy writes.
//
// Pure: no sockets. The parser is fed everything received so far and says
// whether it needs more, failed (with the status to answer), or is done.
#pragma once

#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace agentbox::net {

struct ProxyRequest {
  enum class Kind {
    kConnect,  // CONNECT host:port → a tunnel
    kForward,  // GET http://host/path ... → one request forwarded upstream
  };
  Kind kind = Kind::kConnect;
  std::string method;
  std::string host;        // as written, brackets removed; not yet normalised
  std::uint16_t port = 0;
  // kForward: the head to send upstream: origin-form target, Host from the
  // URI, hop-by-hop and Proxy-* fields removed, "Connection: close".
  std::string upstream_head;
  std::size_t head_size = 0;  // bytes of the input that were the head
};

enum class ParseState { kNeedMore, kDone, kError };

struct HttpParseResult {
  ParseState state = ParseState::kNeedMore;
  int status = 0;      // kError: 400, 431, 501
  std::string error;   // kError: one line for the response body
  ProxyRequest request;
};

class HttpRequestParser {
 public:
  // `header_limit` bounds the request line plus fields (431 beyond it).
  explicit HttpRequestParser(std::size_t header_limit);

  // `data` is everything received so far on the connection: each call must
  // pass the previous call's bytes again, followed by new ones. After kDone
  // or kError the parser is finished.
  HttpParseResult Parse(std::string_view data);

 private:
  HttpParseResult Finish(std::string_view data, std::size_t head_size);

  boost::beast::http::request_parser<boost::beast::http::empty_body> parser_;
  std::size_t offered_ = 0;
};

// Splits "host:port" or "[v6]:port" (the port is required). Returns nothing
// when malformed.
std::optional<std::pair<std::string, std::uint16_t>> SplitAuthority(std::string_view authority,
                                                                    std::optional<std::uint16_t> default_port);

// A complete response with "Connection: close" and a one-line text body.
// `denied_reason` non-empty adds "X-Agentbox-Denied: <reason>".
std::string SimpleResponse(int status, std::string_view denied_reason, std::string_view body_line);

}  // namespace agentbox::net
