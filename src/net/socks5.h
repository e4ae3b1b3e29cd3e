// SOCKS5 (RFC 1928) as the proxy speaks it: no authentication, CONNECT only.
// Pure parsing of the two client messages and the reply the proxy sends.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace agentbox::net {

enum class SocksState { kNeedMore, kDone, kError };

struct SocksGreeting {
  SocksState state = SocksState::kNeedMore;
  bool no_auth = false;       // method 0x00 offered
  std::size_t size = 0;       // bytes of the greeting
};
// VER=5, NMETHODS (1..255), METHODS.
SocksGreeting ParseSocksGreeting(std::string_view data);

inline constexpr std::uint8_t kSocksConnect = 0x01;
inline constexpr std::uint8_t kSocksBind = 0x02;
inline constexpr std::uint8_t kSocksUdpAssociate = 0x03;

// Reply codes used by the proxy.
inline constexpr std::uint8_t kSocksSucceeded = 0x00;
inline constexpr std::uint8_t kSocksGeneralFailure = 0x01;
inline constexpr std::uint8_t kSocksNotAllowed = 0x02;
inline constexpr std::uint8_t kSocksNetworkUnreachable = 0x03;
inline constexpr std::uint8_t kSocksHostUnreachable = 0x04;
inline constexpr std::uint8_t kSocksConnectionRefused = 0x05;
inline constexpr std::uint8_t kSocksTtlExpired = 0x06;  // also used for a connect timeout
inline constexpr std::uint8_t kSocksCommandNotSupported = 0x07;
inline constexpr std::uint8_t kSocksAddressTypeNotSupported = 0x08;

struct SocksRequest {
  SocksState state = SocksState::kNeedMore;
  std::uint8_t reply = 0;     // kError: the reply code to send before closing
  std::uint8_t command = 0;
  std::string host;           // domain name as sent, or the address as text
  std::uint16_t port = 0;
  std::size_t size = 0;       // bytes of the request
};
// VER=5, CMD, RSV=0, ATYP (1 IPv4, 3 domain, 4 IPv6), DST.ADDR, DST.PORT.
// A domain of length 0 or with a NUL byte is an error; unknown ATYP → 0x08.
SocksRequest ParseSocksRequest(std::string_view data);

// VER=5, REP, RSV, ATYP=1, 0.0.0.0:0 (the bound address is not disclosed).
std::array<std::uint8_t, 10> SocksReply(std::uint8_t code);

}  // namespace agentbox::net
