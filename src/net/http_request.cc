#include "net/http_request.h"

#include <boost/beast/http/error.hpp>

#include <algorithm>
#include <limits>
#include <vector>

#include "net/http_text.h"

namespace agentbox::net {
namespace {

namespace http = boost::beast::http;

HttpParseResult Error(int status, std::string message) {
  HttpParseResult r;
  r.state = ParseState::kError;
  r.status = status;
  r.error = std::move(message);
  return r;
}

const char* Reason(int status) {
  switch (status) {
    case 200: return "Connection established";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
  }
  return "Error";
}

}  // namespace

std::optional<std::pair<std::string, std::uint16_t>> SplitAuthority(std::string_view authority,
                                                                    std::optional<std::uint16_t> default_port) {
  std::string_view host = authority;
  std::string_view port;
  bool has_port = false;
  if (!authority.empty() && authority.front() == '[') {
    std::size_t close = authority.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    host = authority.substr(1, close - 1);
    std::string_view rest = authority.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return std::nullopt;
      port = rest.substr(1);
      has_port = true;
    }
  } else if (std::size_t colon = authority.rfind(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
    has_port = true;
    if (host.find(':') != std::string_view::npos) return std::nullopt;  // unbracketed IPv6
  }
  if (host.empty()) return std::nullopt;
  std::uint16_t value = 0;
  if (has_port) {
    if (port.empty() || port.size() > 5) return std::nullopt;
    unsigned p = 0;
    for (char c : port) {
      if (c < '0' || c > '9') return std::nullopt;
      p = p * 10 + static_cast<unsigned>(c - '0');
    }
    if (p == 0 || p > 65535) return std::nullopt;
    value = static_cast<std::uint16_t>(p);
  } else if (default_port) {
    value = *default_port;
  } else {
    return std::nullopt;
  }
  return std::pair{std::string(host), value};
}

HttpRequestParser::HttpRequestParser(std::size_t header_limit) {
  parser_.header_limit(static_cast<std::uint32_t>(header_limit));
  parser_.eager(false);
  // Only the head is parsed here; the body is relayed as is. Beast's
  // default 1 MiB body limit would refuse a larger Content-Length outright.
  parser_.body_limit(std::numeric_limits<std::uint64_t>::max());
}

HttpParseResult HttpRequestParser::Parse(std::string_view data) {
  if (data.size() <= offered_) return {};  // nothing new
  offered_ = data.size();
  boost::system::error_code ec;
  std::size_t used = parser_.put(boost::asio::buffer(data.data(), data.size()), ec);
  if (ec == http::error::need_more) return {};
  if (ec == http::error::header_limit) return Error(431, "request header larger than the limit");
  if (ec) return Error(400, "malformed request (" + ec.message() + ")");
  if (!parser_.is_header_done()) return {};
  return Finish(data, used);
}

HttpParseResult HttpRequestParser::Finish(std::string_view data, std::size_t head_size) {
  (void)data;
  const auto& req = parser_.get();
  HttpParseResult result;
  result.state = ParseState::kDone;
  ProxyRequest& out = result.request;
  out.method = std::string(SV(req.method_string()));
  out.head_size = head_size;
  std::string_view target = SV(req.target());

  if (req.method() == http::verb::connect) {
    auto authority = SplitAuthority(target, std::nullopt);
    if (!authority) return Error(400, "CONNECT needs host:port, got \"" + std::string(target.substr(0, 200)) + "\"");
    out.kind = ProxyRequest::Kind::kConnect;
    out.host = authority->first;
    out.port = authority->second;
    return result;
  }

  // Absolute-URI form, the only one a forward proxy serves for plain HTTP.
  constexpr std::string_view kScheme = "http://";
  if (target.size() < kScheme.size() || !IEquals(target.substr(0, kScheme.size()), kScheme)) {
    if (target.size() >= 8 && IEquals(target.substr(0, 8), "https://")) {
      return Error(400, "https:// URLs go through CONNECT");
    }
    return Error(400, "a proxy request needs an absolute http:// URI or CONNECT");
  }
  std::string_view rest = target.substr(kScheme.size());
  std::size_t end = rest.find_first_of("/?#");
  std::string_view authority = rest.substr(0, end);
  std::string_view path = end == std::string_view::npos ? std::string_view() : rest.substr(end);
  if (authority.find('@') != std::string_view::npos) return Error(400, "credentials in the URI are not forwarded");
  auto split = SplitAuthority(authority, std::uint16_t{80});
  if (!split) return Error(400, "bad host in URI");
  out.kind = ProxyRequest::Kind::kForward;
  out.host = split->first;
  out.port = split->second;
  if (std::size_t hash = path.find('#'); hash != std::string_view::npos) path = path.substr(0, hash);
  std::string origin = path.empty() || path.front() != '/' ? "/" + std::string(path) : std::string(path);

  // Fields named in Connection are hop-by-hop too (RFC 9110 §7.6.1).
  std::vector<std::string> hop = {"connection", "proxy-connection", "keep-alive", "proxy-authorization",
                                  "proxy-authenticate", "te", "trailer", "upgrade", "host"};
  bool content_length = false, chunked = false;
  for (const auto& field : req) {
    std::string_view name = SV(field.name_string());
    if (IEquals(name, "connection") || IEquals(name, "proxy-connection")) {
      std::string_view value = SV(field.value());
      while (!value.empty()) {
        std::size_t comma = value.find(',');
        std::string token(TrimOws(value.substr(0, comma)));
        std::transform(token.begin(), token.end(), token.begin(), [](unsigned char c) { return std::tolower(c); });
        if (!token.empty()) hop.push_back(token);
        if (comma == std::string_view::npos) break;
        value.remove_prefix(comma + 1);
      }
    }
    content_length = content_length || IEquals(name, "content-length");
    chunked = chunked || IEquals(name, "transfer-encoding");
  }
  // Both framings at once is the classic request-smuggling shape.
  if (content_length && chunked) return Error(400, "both Content-Length and Transfer-Encoding");

  std::string head;
  head.reserve(head_size + 64);
  head += out.method;
  head += ' ';
  head += origin;
  head += req.version() == 10 ? " HTTP/1.0\r\n" : " HTTP/1.1\r\n";
  head += "Host: ";
  head += authority;
  head += "\r\n";
  for (const auto& field : req) {
    std::string name(SV(field.name_string()));
    std::string lower = name;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    if (std::find(hop.begin(), hop.end(), lower) != hop.end()) continue;
    head += name;
    head += ": ";
    head += SV(field.value());
    head += "\r\n";
  }
  // One request per upstream connection: the response is relayed as bytes,
  // and the next request on a kept-alive connection might name another host.
  head += "Connection: close\r\n\r\n";
  out.upstream_head = std::move(head);
  return result;
}

std::string SimpleResponse(int status, std::string_view denied_reason, std::string_view body_line) {
  std::string body(body_line);
  for (char& c : body) {
    if (c == '\r' || c == '\n') c = ' ';
  }
  body += '\n';
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + Reason(status) + "\r\n";
  if (!denied_reason.empty()) out += "X-Agentbox-Denied: " + std::string(denied_reason) + "\r\n";
  out += "Content-Type: text/plain; charset=utf-8\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\nProxy-Connection: close\r\n\r\n" + body;
  return out;
}

}  // namespace agentbox::net
