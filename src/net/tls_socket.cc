#include "net/tls_socket.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <sys/socket.h>

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "net/tls.h"

namespace agentbox::net {
namespace {

namespace asio = boost::asio;
using boost::system::error_code;

// The BIO: recv/send on the socket, after the bytes of `prefix`. send uses
// MSG_NOSIGNAL: a peer that is gone must not raise SIGPIPE in the proxy.
struct SocketBio {
  int fd;
  std::string prefix;
};

int BioRead(BIO* b, char* out, int len) {
  auto* d = static_cast<SocketBio*>(BIO_get_data(b));
  BIO_clear_retry_flags(b);
  if (!d->prefix.empty()) {
    const std::size_t n = std::min<std::size_t>(d->prefix.size(), static_cast<std::size_t>(len));
    std::memcpy(out, d->prefix.data(), n);
    d->prefix.erase(0, n);
    return static_cast<int>(n);
  }
  ssize_t n = ::recv(d->fd, out, static_cast<std::size_t>(len), 0);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) BIO_set_retry_read(b);
    return -1;
  }
  return static_cast<int>(n);
}

int BioWrite(BIO* b, const char* in, int len) {
  auto* d = static_cast<SocketBio*>(BIO_get_data(b));
  BIO_clear_retry_flags(b);
  ssize_t n = ::send(d->fd, in, static_cast<std::size_t>(len), MSG_NOSIGNAL);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) BIO_set_retry_write(b);
    return -1;
  }
  return static_cast<int>(n);
}

long BioCtrl(BIO*, int cmd, long, void*) {
  return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

int BioDestroy(BIO* b) {
  delete static_cast<SocketBio*>(BIO_get_data(b));
  BIO_set_data(b, nullptr);
  return 1;
}

BIO_METHOD* SocketMethod() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "agentbox socket");
    BIO_meth_set_read(m, BioRead);
    BIO_meth_set_write(m, BioWrite);
    BIO_meth_set_ctrl(m, BioCtrl);
    BIO_meth_set_destroy(m, BioDestroy);
    return m;
  }();
  return method;
}

}  // namespace

TlsSocket::TlsSocket(asio::ip::tcp::socket& socket, SSL_CTX* ctx, std::string prefix) : socket_(socket) {
  error_code ec;
  socket_.non_blocking(true, ec);
  ssl_ = SSL_new(ctx);
  BIO* bio = ssl_ != nullptr ? BIO_new(SocketMethod()) : nullptr;
  if (bio == nullptr) {
    SSL_free(ssl_);
    ssl_ = nullptr;
    error_ = SslErrors("out of memory for TLS");
    return;
  }
  BIO_set_data(bio, new SocketBio{socket_.native_handle(), std::move(prefix)});
  BIO_set_init(bio, 1);
  SSL_set_bio(ssl_, bio, bio);  // one BIO both ways: one reference taken
}

TlsSocket::~TlsSocket() {
  // A connection freed without close_notify would mark its session (an
  // upstream's ticket, kept for resumption) as not resumable: what ends
  // here ends as if it had been shut down.
  if (ssl_ != nullptr && SSL_is_init_finished(ssl_)) SSL_set_shutdown(ssl_, SSL_get_shutdown(ssl_) | SSL_SENT_SHUTDOWN);
  SSL_free(ssl_);
}

asio::awaitable<bool> TlsSocket::Wait(int ssl_error) {
  error_code ec;
  if (ssl_error == SSL_ERROR_WANT_READ) {
    co_await socket_.async_wait(asio::ip::tcp::socket::wait_read, asio::redirect_error(asio::use_awaitable, ec));
  } else if (ssl_error == SSL_ERROR_WANT_WRITE) {
    co_await socket_.async_wait(asio::ip::tcp::socket::wait_write, asio::redirect_error(asio::use_awaitable, ec));
  } else {
    const long verify = ssl_ != nullptr ? SSL_get_verify_result(ssl_) : X509_V_OK;
    if (verify != X509_V_OK) {
      error_ = std::string("certificate not trusted: ") + X509_verify_cert_error_string(verify);
    } else if (ssl_error == SSL_ERROR_SYSCALL) {
      error_ = errno != 0 ? std::string(std::strerror(errno)) : "the peer closed the connection";
      ERR_clear_error();
    } else {
      error_ = SslErrors("TLS error " + std::to_string(ssl_error));
    }
    co_return false;
  }
  if (ec) {
    error_ = ec == asio::error::operation_aborted || ec == asio::error::bad_descriptor ? "closed" : ec.message();
    co_return false;
  }
  co_return true;
}

asio::awaitable<bool> TlsSocket::Handshake(Role role) {
  if (ssl_ == nullptr) co_return false;
  if (role == Role::kServer) {
    SSL_set_accept_state(ssl_);
  } else {
    SSL_set_connect_state(ssl_);
  }
  while (true) {
    ERR_clear_error();
    const int r = SSL_do_handshake(ssl_);
    if (r == 1) co_return true;
    errno = 0;
    if (!co_await Wait(SSL_get_error(ssl_, r))) co_return false;
  }
}

asio::awaitable<long> TlsSocket::ReadSome(void* buffer, std::size_t size) {
  if (ssl_ == nullptr) co_return -1;
  const int want = static_cast<int>(std::min<std::size_t>(size, INT_MAX));
  while (true) {
    ERR_clear_error();
    errno = 0;
    const int r = SSL_read(ssl_, buffer, want);
    if (r > 0) co_return r;
    const int e = SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_ZERO_RETURN) co_return 0;
    if (e == SSL_ERROR_SYSCALL && errno == 0) co_return 0;  // EOF without close_notify
    if (!co_await Wait(e)) co_return -1;
  }
}

asio::awaitable<bool> TlsSocket::WriteAll(std::string_view data) {
  if (ssl_ == nullptr) co_return false;
  while (!data.empty()) {
    ERR_clear_error();
    errno = 0;
    // The same bytes again after WANT_WRITE, as SSL_write requires.
    const int n = static_cast<int>(std::min<std::size_t>(data.size(), 1 << 20));
    const int r = SSL_write(ssl_, data.data(), n);
    if (r > 0) {
      data.remove_prefix(static_cast<std::size_t>(r));
      continue;
    }
    if (!co_await Wait(SSL_get_error(ssl_, r))) co_return false;
  }
  co_return true;
}

void TlsSocket::Shutdown() {
  if (ssl_ == nullptr) return;
  ERR_clear_error();
  (void)SSL_shutdown(ssl_);
  ERR_clear_error();
}

}  // namespace agentbox::net
