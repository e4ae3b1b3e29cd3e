#include "net/socks5.h"

#include "net/rules.h"

namespace agentbox::net {
namespace {

std::uint8_t Byte(std::string_view d, std::size_t i) { return static_cast<std::uint8_t>(d[i]); }

SocksRequest Fail(std::uint8_t reply) {
  SocksRequest r;
  r.state = SocksState::kError;
  r.reply = reply;
  return r;
}

}  // namespace

SocksGreeting ParseSocksGreeting(std::string_view data) {
  SocksGreeting g;
  if (data.empty()) return g;
  if (Byte(data, 0) != 5) {
    g.state = SocksState::kError;
    return g;
  }
  if (data.size() < 2) return g;
  std::size_t n = Byte(data, 1);
  if (n == 0) {
    g.state = SocksState::kError;
    return g;
  }
  if (data.size() < 2 + n) return g;
  for (std::size_t i = 0; i < n; ++i) g.no_auth = g.no_auth || Byte(data, 2 + i) == 0x00;
  g.state = SocksState::kDone;
  g.size = 2 + n;
  return g;
}

SocksRequest ParseSocksRequest(std::string_view data) {
  SocksRequest r;
  if (data.size() >= 1 && Byte(data, 0) != 5) return Fail(kSocksGeneralFailure);
  if (data.size() >= 3 && Byte(data, 2) != 0) return Fail(kSocksGeneralFailure);
  if (data.size() < 4) return r;
  std::size_t addr_len = 0;
  std::size_t offset = 4;
  switch (Byte(data, 3)) {
    case 0x01: addr_len = 4; break;
    case 0x04: addr_len = 16; break;
    case 0x03:
      if (data.size() < 5) return r;
      addr_len = Byte(data, 4);
      if (addr_len == 0) return Fail(kSocksGeneralFailure);
      offset = 5;
      break;
    default: return Fail(kSocksAddressTypeNotSupported);
  }
  if (data.size() < offset + addr_len + 2) return r;
  std::string_view addr = data.substr(offset, addr_len);
  r.command = Byte(data, 1);
  if (Byte(data, 3) == 0x03) {
    if (addr.find('\0') != std::string_view::npos) return Fail(kSocksGeneralFailure);
    r.host = std::string(addr);
  } else {
    IpAddress ip;
    ip.v6 = addr_len == 16;
    for (std::size_t i = 0; i < addr_len; ++i) ip.bytes[i] = Byte(addr, i);
    r.host = ip.ToString();
  }
  r.port = static_cast<std::uint16_t>((Byte(data, offset + addr_len) << 8) | Byte(data, offset + addr_len + 1));
  r.size = offset + addr_len + 2;
  r.state = SocksState::kDone;
  return r;
}

std::array<std::uint8_t, 10> SocksReply(std::uint8_t code) { return {5, code, 0, 1, 0, 0, 0, 0, 0, 0}; }

}  // namespace agentbox::net
