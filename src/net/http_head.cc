#include "net/http_head.h"

#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>

#include <limits>
#include <optional>

#include "net/http_text.h"

namespace agentbox::net {
namespace {

namespace http = boost::beast::http;

HeadParse Fail(int status, std::string reason) {
  HeadParse r;
  r.state = ParseState::kError;
  r.status = status;
  r.reason = std::move(reason);
  return r;
}

struct RawField {
  std::string_view name;
  std::string_view value;  // OWS trimmed
};

// The head split at CRLF (the scan has already refused bare CR, bare LF and
// NUL) and each field line checked for what Beast would quietly accept or
// turn into a different field: obs-fold (Beast joins the lines), whitespace
// before the colon, control characters in values.
struct RawHead {
  std::string_view request_line;
  std::vector<RawField> fields;
};

std::optional<HeadParse> SplitHead(std::string_view head, RawHead& out) {
  std::size_t eol = head.find("\r\n");
  out.request_line = head.substr(0, eol);
  std::size_t pos = eol + 2;
  for (;;) {
    eol = head.find("\r\n", pos);
    std::string_view line = head.substr(pos, eol - pos);
    pos = eol + 2;
    if (line.empty()) return std::nullopt;  // the blank line that ends the head
    if (line.front() == ' ' || line.front() == '\t') {
      if (out.fields.empty()) return Fail(400, "smuggling: whitespace before the first field");
      return Fail(400, "smuggling: obs-fold in field " + Printable(out.fields.back().name));
    }
    std::size_t colon = line.find(':');
    if (colon == std::string_view::npos) return Fail(400, "bad field: no colon in " + Printable(line));
    std::string_view name = line.substr(0, colon);
    if (!name.empty() && (name.back() == ' ' || name.back() == '\t')) {
      return Fail(400, "bad field: space before the colon in " + Printable(TrimOws(name)));
    }
    if (!IsToken(name)) return Fail(400, "bad field: name is not a token: " + Printable(name));
    std::string_view value = line.substr(colon + 1);
    for (char c : value) {
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) {
        return Fail(400, "bad field: control character in " + Printable(name));
      }
    }
    out.fields.push_back({name, TrimOws(value)});
  }
}

// Comma-separated list members, OWS trimmed, empty members dropped.
std::vector<std::string_view> ListMembers(std::string_view value) {
  std::vector<std::string_view> out;
  while (true) {
    std::size_t comma = value.find(',');
    std::string_view member = TrimOws(value.substr(0, comma));
    if (!member.empty()) out.push_back(member);
    if (comma == std::string_view::npos) return out;
    value.remove_prefix(comma + 1);
  }
}

// 1*DIGIT without a sign, spaces, or leading zeros (which some parsers read
// as octal), fitting in 64 bits.
std::optional<std::uint64_t> ParseLength(std::string_view text) {
  if (text.empty() || (text.size() > 1 && text.front() == '0')) return std::nullopt;
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    auto digit = static_cast<std::uint64_t>(c - '0');
    if (v > (kMax - digit) / 10) return std::nullopt;
    v = v * 10 + digit;
  }
  return v;
}

struct Framing {
  BodyFraming kind = BodyFraming::kNone;
  std::uint64_t length = 0;
};

// Everything that decides where this request ends, or which host it is for,
// checked on the fields exactly as sent: the proxy and the real host must
// read the same framing, whichever of their parsers is more lenient.
std::optional<HeadParse> CheckFraming(const std::vector<RawField>& fields, Framing& out) {
  const RawField* length = nullptr;
  const RawField* coding = nullptr;
  int hosts = 0;
  for (const RawField& f : fields) {
    if (IEquals(f.name, "Content-Length")) {
      if (length) return Fail(400, "smuggling: duplicate Content-Length");
      length = &f;
    } else if (IEquals(f.name, "Transfer-Encoding")) {
      if (coding) return Fail(400, "smuggling: duplicate Transfer-Encoding");
      coding = &f;
    } else if (IEquals(f.name, "Host")) {
      ++hosts;
      if (f.value.empty()) return Fail(400, "empty Host");
      // Syntax only (the port is a placeholder): the caller compares the
      // normalised name with the one the tunnel was opened for.
      auto authority = SplitAuthority(f.value, std::uint16_t{443});
      if (!authority || f.value.find_first_of("@/\\?# \t") != std::string_view::npos) {
        return Fail(400, "bad Host");
      }
    } else if (IEquals(f.name, "Upgrade")) {
      return Fail(501, "upgrade not supported");
    } else if (IEquals(f.name, "Connection")) {
      // A hop that drops the fields Connection names would drop these too,
      // and the next hop would then frame the body differently.
      for (std::string_view member : ListMembers(f.value)) {
        for (const char* framing : {"Content-Length", "Transfer-Encoding", "Host"}) {
          if (IEquals(member, framing)) return Fail(400, std::string("smuggling: Connection names ") + framing);
        }
      }
    }
  }
  if (hosts == 0) return Fail(400, "missing Host");
  if (hosts > 1) return Fail(400, "duplicate Host");
  if (length && coding) return Fail(400, "smuggling: Content-Length with Transfer-Encoding");
  if (coding) {
    // Beast reads "chunked, identity" as no framing at all and "gzip,
    // chunked" as chunked; others differ. Only the one unambiguous form.
    if (!IEquals(coding->value, "chunked")) return Fail(400, "smuggling: Transfer-Encoding other than chunked");
    out.kind = BodyFraming::kChunked;
  }
  if (length) {
    if (length->value.find(',') != std::string_view::npos) return Fail(400, "smuggling: Content-Length list");
    auto n = ParseLength(length->value);
    if (!n) return Fail(400, "bad Content-Length");
    out.kind = BodyFraming::kLength;
    out.length = *n;
  }
  return std::nullopt;
}

std::string BeastReason(const boost::system::error_code& ec) {
  if (ec == http::error::bad_method) return "bad method: not a token";
  if (ec == http::error::bad_target) return "bad request-target";
  if (ec == http::error::bad_version) return "bad HTTP version";
  if (ec == http::error::bad_field) return "bad field name";
  if (ec == http::error::bad_value) return "bad field value";
  if (ec == http::error::bad_line_ending) return "bare CR";
  if (ec == http::error::bad_content_length) return "bad Content-Length";
  if (ec == http::error::bad_transfer_encoding) return "smuggling: bad Transfer-Encoding";
  return "malformed request (" + ec.message() + ")";
}

// The complete head (it ends with CRLF CRLF and holds no NUL, bare CR or
// bare LF): our line checks first, so that each refusal has its own reason,
// then Beast's grammar, then what the terminated stream does not serve.
HeadParse ParseCompleteHead(std::string_view head) {
  if (head.starts_with("\r\n")) return Fail(400, "empty line before the request line");
  RawHead raw;
  if (auto failed = SplitHead(head, raw)) return *failed;
  // HTTP/2 with prior knowledge (h2c, or h2 despite ALPN): the preface's
  // first part reads as a head of its own.
  if (raw.request_line == "PRI * HTTP/2.0") return Fail(501, "upgrade not supported: HTTP/2 preface");
  // method SP request-target SP HTTP-version, by shape only (Beast checks
  // each part below), so that a broken request line is named as such before
  // anything is said about its fields.
  std::string_view line = raw.request_line;
  std::size_t sp1 = line.find(' ');
  std::size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (!IsToken(line.substr(0, sp1))) return Fail(400, "bad method: not a token");
  if (sp2 == std::string_view::npos || sp2 == sp1 + 1 || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return Fail(400, "bad request line");
  }
  if (std::string_view v = line.substr(sp2 + 1); v != "HTTP/1.1" && v != "HTTP/1.0") {
    return Fail(400, "bad HTTP version");
  }
  Framing framing;
  if (auto failed = CheckFraming(raw.fields, framing)) return *failed;

  http::request_parser<http::empty_body> parser;
  parser.header_limit(std::numeric_limits<std::uint32_t>::max());
  // Not boost::none: Beast 1.74 compares an empty optional as smaller than
  // any length and refuses every Content-Length body.
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  parser.eager(false);
  boost::system::error_code ec;
  std::size_t used = parser.put(boost::asio::buffer(head.data(), head.size()), ec);
  if (ec) return Fail(400, BeastReason(ec));
  const auto& req = parser.get();
  std::size_t beast_fields = static_cast<std::size_t>(std::distance(req.begin(), req.end()));
  if (!parser.is_header_done() || used != head.size() || beast_fields != raw.fields.size()) {
    return Fail(400, "malformed request");  // our split and Beast's disagree: refuse rather than guess
  }

  HeadParse result;
  result.state = ParseState::kDone;
  RequestHead& out = result.head;
  out.method = std::string(SV(req.method_string()));
  out.target = std::string(SV(req.target()));
  out.version = static_cast<int>(req.version());
  out.head_size = head.size();
  for (const auto& f : req) {
    out.fields.emplace_back(std::string(SV(f.name_string())), std::string(SV(f.value())));
  }
  out.host = *out.Field("Host");
  out.framing = framing.kind;
  out.content_length = framing.length;

  if (out.method == "CONNECT") return Fail(501, "CONNECT not supported");
  if (out.target == "*") return Fail(501, "asterisk-form target not supported");
  if (out.target.empty() || out.target.front() != '/') {
    // Refused rather than served: its authority could name another host
    // than Host and the TLS name, and each hop would pick a different one.
    if (out.target.find("://") != std::string::npos) return Fail(400, "absolute-form target");
    return Fail(400, "request-target not in origin-form");
  }
  for (char c : out.target) {
    if (c == '#') return Fail(400, "fragment in request-target");
    if (static_cast<unsigned char>(c) >= 0x80) return Fail(400, "non-ASCII byte in request-target");
  }
  if (out.version == 10 && framing.kind == BodyFraming::kChunked) {
    return Fail(400, "smuggling: Transfer-Encoding in HTTP/1.0");
  }
  return result;
}

}  // namespace

const std::string* RequestHead::Field(std::string_view name) const {
  for (const auto& [n, v] : fields) {
    if (IEquals(n, name)) return &v;
  }
  return nullptr;
}

void RequestHead::Set(std::string_view name, std::string value) {
  bool placed = false;
  for (auto it = fields.begin(); it != fields.end();) {
    if (!IEquals(it->first, name)) {
      ++it;
    } else if (!placed) {
      *it = {std::string(name), std::move(value)};
      placed = true;
      ++it;
    } else {
      it = fields.erase(it);
    }
  }
  if (!placed) fields.emplace_back(std::string(name), std::move(value));
}

void RequestHead::Remove(std::string_view name) {
  std::erase_if(fields, [&](const auto& f) { return IEquals(f.first, name); });
}

HeadParse RequestHeadParser::Parse(std::string_view data) {
  if (finished_) return result_;
  auto finish = [&](HeadParse r) {
    finished_ = true;
    result_ = std::move(r);
    return result_;
  };
  // Only the bytes that may still belong to the head are looked at, each
  // once over all calls: everything before `scanned_` has passed already.
  std::size_t end = std::min(data.size(), limit_);
  for (std::size_t i = scanned_; i < end; ++i) {
    char c = data[i];
    if (c == '\0') return finish(Fail(400, "NUL in the head"));
    if (i > 0 && data[i - 1] == '\r' && c != '\n') return finish(Fail(400, "bare CR"));
    if (c != '\n') continue;
    if (i == 0 || data[i - 1] != '\r') return finish(Fail(400, "bare LF"));
    // Every LF so far followed a CR, so "\n" two bytes back closes CRLF CRLF.
    if (i >= 3 && data[i - 2] == '\n') return finish(ParseCompleteHead(data.substr(0, i + 1)));
  }
  scanned_ = std::max(scanned_, end);
  if (data.size() >= limit_ && !data.empty()) return finish(Fail(431, "header larger than the limit"));
  return {};
}

HeadParse ParseTerminatedRequestHead(std::string_view data, std::size_t limit) {
  return RequestHeadParser(limit).Parse(data);
}

Result<std::string> SerialiseRequestHead(const RequestHead& head) {
  auto fail = [](const std::string& why) { return Status::Error("http", "request head not forwarded: " + why); };
  if (head.version != 10 && head.version != 11) return fail("HTTP version " + std::to_string(head.version));
  // Checked here, not only by parsing the result again: "x\r\nX-Other: y"
  // in a value would parse back as two good fields.
  if (!IsToken(head.method)) return fail("method is not a token");
  for (char c : head.target) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) return fail("control character or space in the target");
  }
  for (const auto& [name, value] : head.fields) {
    if (!IsToken(name)) return fail("field name is not a token: " + Printable(name));
    for (char c : value) {
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) {
        return fail("control character in the value of " + Printable(name));
      }
    }
  }
  std::string out;
  out.reserve(head.head_size + 256);
  out += head.method;
  out += ' ';
  out += head.target;
  out += head.version == 10 ? " HTTP/1.0\r\n" : " HTTP/1.1\r\n";
  for (const auto& [name, value] : head.fields) {
    out += name;
    out += ": ";
    out += value;
    out += "\r\n";
  }
  out += "\r\n";
  // What goes upstream must pass the rules it came in under, and frame the
  // body the way the proxy will relay it.
  HeadParse again = ParseTerminatedRequestHead(out, out.size());
  if (again.state != ParseState::kDone) return fail(again.reason.empty() ? "incomplete" : again.reason);
  if (again.head.head_size != out.size() || again.head.fields.size() != head.fields.size()) {
    return fail("the fields do not parse back as written");
  }
  if (again.head.framing != head.framing || again.head.content_length != head.content_length) {
    return fail("its body framing differs from the one the request is relayed with");
  }
  return out;
}

}  // namespace agentbox::net
