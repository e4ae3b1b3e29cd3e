// TLS for the terminator: a per-run certificate authority whose key never
// leaves this process, the leaf certificates it issues for the hosts the
// proxy terminates, and the client context that verifies upstreams against
// the host's trust store.
//
// Thread-compatible: a RunCa is used from the proxy's io thread only.
#pragma once

#include <openssl/ssl.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agentbox/status.h"

namespace agentbox::net {

struct SslCtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
using SslCtxPtr = std::unique_ptr<SSL_CTX, SslCtxFree>;

// The OpenSSL error queue as one line ("error:0A000086:SSL routines::certificate
// verify failed"), emptied; `fallback` when the queue holds nothing.
std::string SslErrors(const std::string& fallback = "");

class RunCa {
 public:
  // A fresh P-256 key and a self-signed CA certificate valid from an hour
  // ago for `valid_days`. `names` (normalised hosts, "*.example.com" for
  // subdomains, IP literals) go into a critical name constraint: the CA can
  // vouch for nothing else, even if its certificate is copied out of the
  // sandbox. Empty: no constraint.
  static Result<std::unique_ptr<RunCa>> Create(const std::vector<std::string>& names, int valid_days = 30);
  ~RunCa();
  RunCa(const RunCa&) = delete;
  RunCa& operator=(const RunCa&) = delete;

  const std::string& certificate_pem() const { return ca_pem_; }

  // The server context presenting a leaf for `host` (a DNS name or an IP
  // literal), made on first use and kept. ALPN: http/1.1 only; a client that
  // offers ALPN without http/1.1 (h2 alone) fails the handshake with
  // no_application_protocol instead of speaking a protocol nobody inspects.
  Result<SSL_CTX*> ServerContext(const std::string& host);

 private:
  RunCa() = default;
  struct Key;
  std::unique_ptr<Key> key_;
  std::string ca_pem_;
  std::map<std::string, SslCtxPtr> servers_;
};

// The context for connections to upstreams: peer verification against the
// default trust store (SSL_CERT_FILE / SSL_CERT_DIR when set in this
// process's environment, else the system's), TLS 1.2 at least, ALPN http/1.1.
// The host name itself is checked per connection (PrepareUpstream).
Result<SslCtxPtr> MakeUpstreamContext();

// Per connection: SNI and the name the certificate must carry (or the IP
// address it must list, for an IP literal).
Status PrepareUpstream(SSL* ssl, const std::string& host);

// The sessions upstreams hand out (TLS 1.3 tickets, 1.2 session ids), kept
// per host so that the next connection to the host resumes: its handshake
// skips the certificate chain, which was verified when the session was made.
// A session is only ever offered to the host it came from. Installs itself
// on `ctx`, which must outlive it; used on one thread.
class UpstreamSessions {
 public:
  explicit UpstreamSessions(SSL_CTX* ctx);
  ~UpstreamSessions();
  UpstreamSessions(const UpstreamSessions&) = delete;
  UpstreamSessions& operator=(const UpstreamSessions&) = delete;
  // Before the handshake: names the connection's host and offers its session.
  void Offer(SSL* ssl, const std::string& host);

 private:
  static int OnNewSession(SSL* ssl, SSL_SESSION* session);
  SSL_CTX* ctx_;
  std::map<std::string, SSL_SESSION*> by_host_;
};

// The file of certificates the default trust store reads (SSL_CERT_FILE,
// else OpenSSL's default file): what a sandbox should trust besides the
// run CA.
std::string DefaultTrustFile();

}  // namespace agentbox::net
