#include "net/tls_sni.h"

#include <cstdint>

namespace agentbox::net {
namespace {

// A bounds-checked reader; any overrun sets `bad` and yields zeros.
struct Reader {
  std::string_view d;
  bool bad = false;

  std::uint32_t Int(std::size_t n) {
    if (d.size() < n) {
      bad = true;
      d = {};
      return 0;
    }
    std::uint32_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v = (v << 8) | static_cast<std::uint8_t>(d[i]);
    d.remove_prefix(n);
    return v;
  }
  std::string_view Bytes(std::size_t n) {
    if (d.size() < n) {
      bad = true;
      d = {};
      return {};
    }
    std::string_view out = d.substr(0, n);
    d.remove_prefix(n);
    return out;
  }
  // A vector with a length prefix of `n` bytes.
  Reader Sub(std::size_t n) { return Reader{Bytes(Int(n)), bad}; }
};

SniResult Make(SniState state, std::string name = {}) { return {state, std::move(name)}; }

SniResult ParseHello(std::string_view body) {
  Reader r{body};
  r.Int(2);    // legacy_version
  r.Bytes(32); // random
  r.Sub(1);    // legacy_session_id
  Reader suites = r.Sub(2);
  Reader compression = r.Sub(1);
  if (r.bad || suites.bad || compression.bad) return Make(SniState::kMalformed);
  if (r.d.empty()) return Make(SniState::kAbsent);  // no extensions at all
  Reader exts = r.Sub(2);
  if (r.bad || exts.bad) return Make(SniState::kMalformed);
  while (!exts.d.empty()) {
    std::uint32_t type = exts.Int(2);
    Reader ext = exts.Sub(2);
    if (exts.bad || ext.bad) return Make(SniState::kMalformed);
    if (type != 0) continue;
    Reader list = ext.Sub(2);
    if (ext.bad || list.bad) return Make(SniState::kMalformed);
    while (!list.d.empty()) {
      std::uint32_t name_type = list.Int(1);
      Reader name = list.Sub(2);
      if (list.bad || name.bad) return Make(SniState::kMalformed);
      if (name_type == 0) {
        if (name.d.empty()) return Make(SniState::kMalformed);
        return Make(SniState::kFound, std::string(name.d));
      }
    }
    return Make(SniState::kAbsent);
  }
  return Make(SniState::kAbsent);
}

}  // namespace

SniResult ParseClientHelloSni(std::string_view stream, std::size_t limit) {
  if (stream.empty()) return Make(SniState::kNeedMore);
  if (static_cast<std::uint8_t>(stream[0]) != 0x16) return Make(SniState::kNotTls);
  // Reassemble handshake bytes from consecutive handshake records.
  std::string handshake;
  Reader records{stream};
  while (true) {
    if (records.d.size() < 5) return Make(SniState::kNeedMore);
    std::uint32_t type = records.Int(1);
    std::uint32_t major = records.Int(1);
    records.Int(1);
    std::uint32_t length = records.Int(2);
    if (type != 0x16 || major != 3 || length == 0 || length > 16384 + 2048) return Make(SniState::kMalformed);
    if (records.d.size() < length) {
      // Decide early when the partial data already breaks the grammar.
      if (handshake.empty() && records.d.size() >= 1 && static_cast<std::uint8_t>(records.d[0]) != 0x01) {
        return Make(SniState::kMalformed);
      }
      return Make(SniState::kNeedMore);
    }
    handshake.append(records.Bytes(length));
    if (handshake.size() > limit) return Make(SniState::kMalformed);
    if (handshake.size() >= 4) {
      Reader h{handshake};
      std::uint32_t msg = h.Int(1);
      std::uint32_t msg_len = h.Int(3);
      if (msg != 0x01 || msg_len + 4 > limit) return Make(SniState::kMalformed);
      if (h.d.size() >= msg_len) return ParseHello(h.d.substr(0, msg_len));
    }
  }
}

}  // namespace agentbox::net
