// The server_name a TLS ClientHello carries (RFC 8446 §4.1.2, RFC 6066 §3),
// read from the first bytes a client sends through a CONNECT tunnel so the
// proxy can refuse a tunnel whose TLS names another host than the target.
#pragma once

#include <string>
#include <string_view>

namespace agentbox::net {

enum class SniState {
  kNeedMore,   // a ClientHello so far, incomplete
  kFound,      // server_name holds the first host_name entry
  kAbsent,     // a complete ClientHello without server_name
  kNotTls,     // the stream does not start with a TLS handshake record
  kMalformed,  // starts like TLS, breaks the grammar or the size bound
};

struct SniResult {
  SniState state = SniState::kNeedMore;
  std::string server_name;
};

// The ClientHello may span several records; at most `limit` bytes of
// handshake are reassembled (kMalformed beyond).
inline constexpr std::size_t kMaxClientHello = 64 * 1024;
SniResult ParseClientHelloSni(std::string_view stream, std::size_t limit = kMaxClientHello);

}  // namespace agentbox::net
