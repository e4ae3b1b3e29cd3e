// The request head of a TLS-terminated stream: the plaintext HTTP/1.1 a
// sandboxed client sends once the proxy has terminated its TLS, parsed
// strictly enough that the proxy and the real host cannot disagree about
// where a request ends or what it asks for.
//
// Pure: no sockets. Boost.Beast checks the grammar; on top of it this refuses
// everything Beast tolerates that could frame a request differently upstream
// (request smuggling) or hide a field from the rules: obs-fold, bare CR/LF,
// NUL, duplicate or non-decimal Content-Length, any Transfer-Encoding but a
// lone "chunked", Content-Length with Transfer-Encoding, a missing or second
// Host, absolute-form targets, Upgrade and the HTTP/2 preface. Each refusal
// carries a status (400, 431, 501) and a short named reason for the log and
// the X-Agentbox-Denied header. The TLS side should offer only "http/1.1" in
// ALPN; a client that speaks HTTP/2 anyway sends the preface and gets 501.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agentbox/status.h"
#include "net/http_request.h"  // ParseState

namespace agentbox::net {

enum class BodyFraming {
  kNone,     // no body (neither Content-Length nor Transfer-Encoding)
  kLength,   // Content-Length bytes follow the head (possibly 0)
  kChunked,  // Transfer-Encoding: chunked (the only coding accepted)
};

struct RequestHead {
  std::string method;  // as sent, e.g. "GET" (methods are case-sensitive)
  std::string target;  // origin-form "/a/b?q", as sent
  int version = 11;    // 10 or 11
  // In order, names as sent, values with the surrounding whitespace removed.
  // The Host field is one of them; SerialiseRequestHead writes exactly these.
  std::vector<std::pair<std::string, std::string>> fields;
  // Set by the parser from `fields`; Set() and Remove() do not update them.
  std::string host;  // the Host field's value as sent (not normalised)
  BodyFraming framing = BodyFraming::kNone;
  std::uint64_t content_length = 0;  // kLength
  std::size_t head_size = 0;         // bytes of input that were the head (the body starts there)

  // The first field called `name` (case-insensitive); nullptr if none.
  const std::string* Field(std::string_view name) const;
  // Replaces every field called `name` by one "name: value" where the first
  // one was, or appends it. The value is not checked here: an unsafe one (CR,
  // LF, NUL) makes SerialiseRequestHead fail.
  void Set(std::string_view name, std::string value);
  void Remove(std::string_view name);
};

struct HeadParse {
  ParseState state = ParseState::kNeedMore;
  int status = 0;      // kError: 400, 431 or 501
  std::string reason;  // kError: e.g. "smuggling: duplicate Content-Length"
  RequestHead head;    // kDone
};

// One request head, fed as it arrives. Each call to Parse passes everything
// received so far for this request (the previous call's bytes again, then new
// ones), as with HttpRequestParser; the parser remembers how far it has
// scanned, so the total cost is linear in the head however it is split, and
// it stops at `limit` bytes (431) without reading further. Errors that show
// before the head is complete (NUL, bare CR or LF, the size) are reported as
// soon as their bytes arrive. After kDone or kError the parser is finished:
// later calls return the same result. One parser per request; the next
// request on the connection starts at head_size plus the body.
class RequestHeadParser {
 public:
  explicit RequestHeadParser(std::size_t limit) : limit_(limit) {}
  HeadParse Parse(std::string_view data);

 private:
  std::size_t limit_;
  std::size_t scanned_ = 0;  // bytes already checked for NUL, bare CR/LF and the end of the head
  bool finished_ = false;
  HeadParse result_;
};

// One-shot form of RequestHeadParser: a fresh parser over `data`. Costs
// O(min(data.size(), limit)) per call, so a caller that calls it once per
// read of a slow stream should keep a RequestHeadParser instead.
HeadParse ParseTerminatedRequestHead(std::string_view data, std::size_t limit);

// "METHOD target HTTP/1.x\r\n", each field "Name: value\r\n", then "\r\n".
// The result is parsed again with the same rules before it is returned, so a
// head changed with Set/Remove can never go upstream with a header injected
// through a value, a second Host, or an ambiguous body framing: any of those
// is an error naming the reason.
Result<std::string> SerialiseRequestHead(const RequestHead& head);

}  // namespace agentbox::net
