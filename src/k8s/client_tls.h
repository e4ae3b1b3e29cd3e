// The TLS connection to an API server, shared by the REST calls (client.cc)
// and the exec stream (exec_stream.cc). Private to src/k8s.
#pragma once

#include <utility>  // before Asio's awaitable.hpp, which uses std::exchange

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>

#include <chrono>
#include <exception>
#include <string>

#include "agentbox/status.h"
#include "k8s/kubeconfig.h"

namespace agentbox::k8s {

// The stage that errors of the API client (connection, TLS, requests, exec
// streams) are reported under.
inline constexpr const char* kApiStage = "kubernetes";

struct TlsContext {
  boost::asio::ssl::context ctx{boost::asio::ssl::context::tls_client};
};

// The server verified against the kubeconfig's CA (or the system's trust
// store when it names none), TLS 1.2 at least, the client certificate when
// the user has one.
Result<std::unique_ptr<TlsContext>> MakeTlsContext(const Kubeconfig& config);

using TlsStream = boost::beast::ssl_stream<boost::beast::tcp_stream>;

// Resolves and connects to the server, sets SNI (a name, not an IP
// literal) and the name the certificate must carry, and handshakes; every
// step bounded by the stream's expiry, which the caller sets. Throws
// boost::system::system_error (caught by the caller, inside this layer).
boost::asio::awaitable<void> OpenTls(TlsStream& stream, const Kubeconfig& config);

// What a failed connection says to a person: the timeout, the TLS verify
// result ("certificate verify failed: unable to get local issuer
// certificate"), or the error's text.
std::string TransportError(std::exception_ptr failure, SSL* ssl);

}  // namespace agentbox::k8s
