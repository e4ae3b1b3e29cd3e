// TLS on a connected, non-blocking TCP socket, driven with C++20 coroutines
// on the socket's executor: OpenSSL reads and writes the socket itself
// (through a small BIO that also serves bytes read from it earlier) and the
// coroutine waits for readiness only when OpenSSL asks to. No BIO pair, no
// copy between OpenSSL and the socket: the terminator's bulk path.
//
// Thread-compatible: one coroutine reads and one writes at a time, on the
// executor's thread. The socket is borrowed and must outlive this object;
// closing it aborts a wait in progress.
#pragma once

#include <openssl/ssl.h>

#include <utility>  // before awaitable.hpp, which uses std::exchange

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <cstddef>
#include <string>
#include <string_view>

namespace agentbox::net {

class TlsSocket {
 public:
  // `prefix`: bytes already read from the socket, which OpenSSL reads first.
  TlsSocket(boost::asio::ip::tcp::socket& socket, SSL_CTX* ctx, std::string prefix = "");
  ~TlsSocket();
  TlsSocket(const TlsSocket&) = delete;
  TlsSocket& operator=(const TlsSocket&) = delete;

  SSL* native_handle() { return ssl_; }
  bool valid() const { return ssl_ != nullptr; }

  enum class Role { kServer, kClient };
  boost::asio::awaitable<bool> Handshake(Role role);
  // >0: bytes read; 0: the peer closed (close_notify or EOF); -1: an error (error()).
  boost::asio::awaitable<long> ReadSome(void* buffer, std::size_t size);
  // False: the peer is gone or TLS failed (error()). `data` must stay put until done.
  boost::asio::awaitable<bool> WriteAll(std::string_view data);
  // Sends close_notify; does not wait for the peer's.
  void Shutdown();
  // The last failure as people read it (the verify result when that failed).
  const std::string& error() const { return error_; }

 private:
  boost::asio::awaitable<bool> Wait(int ssl_error);

  boost::asio::ip::tcp::socket& socket_;
  SSL* ssl_ = nullptr;
  std::string error_;
};

}  // namespace agentbox::net
