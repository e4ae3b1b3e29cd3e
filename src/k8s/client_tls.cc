#include "k8s/client_tls.h"

#include <openssl/x509.h>

#include <boost/asio/use_awaitable.hpp>

#include "net/tls.h"

namespace agentbox::k8s {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;

bool IsIpLiteral(const std::string& host) {
  boost::system::error_code ec;
  (void)asio::ip::make_address(host, ec);
  return !ec;
}

}  // namespace

Result<std::unique_ptr<TlsContext>> MakeTlsContext(const Kubeconfig& config) {
  auto tls = std::make_unique<TlsContext>();
  auto& ctx = tls->ctx;
  boost::system::error_code ec;
  ctx.set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                  asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1);
  ctx.set_verify_mode(asio::ssl::verify_peer, ec);
  if (config.ca_pem.empty()) {
    ctx.set_default_verify_paths(ec);
    if (ec) return Status::Error(kApiStage, config.path + ": the system trust store: " + ec.message());
  } else {
    ctx.add_certificate_authority(asio::buffer(config.ca_pem), ec);
    if (ec) {
      return Status::Error(kApiStage,
                           config.path + ": cluster '" + config.cluster +
                               "': the certificate authority does not load: " + net::SslErrors(ec.message()));
    }
  }
  if (!config.client_cert_pem.empty()) {
    ctx.use_certificate_chain(asio::buffer(config.client_cert_pem), ec);
    if (!ec) ctx.use_private_key(asio::buffer(config.client_key_pem), asio::ssl::context::pem, ec);
    if (!ec && SSL_CTX_check_private_key(ctx.native_handle()) != 1) {
      return Status::Error(kApiStage,
                           config.path + ": user '" + config.user + "': client-key does not match client-certificate");
    }
    if (ec) {
      return Status::Error(kApiStage,
                           config.path + ": user '" + config.user +
                               "': the client certificate or key does not load: " + net::SslErrors(ec.message()));
    }
  }
  return tls;
}

asio::awaitable<void> OpenTls(TlsStream& stream, const Kubeconfig& config) {
  auto executor = co_await asio::this_coro::executor;
  asio::ip::tcp::resolver resolver(executor);
  auto endpoints = co_await resolver.async_resolve(config.host, config.port, asio::use_awaitable);
  co_await beast::get_lowest_layer(stream).async_connect(endpoints, asio::use_awaitable);
  const std::string& name = config.verify_name();
  // RFC 6066: an IP literal is no server name.
  if (!IsIpLiteral(name) && !SSL_set_tlsext_host_name(stream.native_handle(), name.c_str())) {
    throw boost::system::system_error(asio::error::invalid_argument, "the TLS server name " + name + " was refused");
  }
  stream.set_verify_callback(asio::ssl::host_name_verification(name));
  co_await stream.async_handshake(asio::ssl::stream_base::client, asio::use_awaitable);
}

std::string TransportError(std::exception_ptr failure, SSL* ssl) {
  try {
    std::rethrow_exception(failure);
  } catch (const boost::system::system_error& e) {
    if (e.code() == beast::error::timeout) return "no answer in time";
    if (ssl) {
      const long verify = SSL_get_verify_result(ssl);
      if (verify != X509_V_OK) {
        return std::string("TLS: the server's certificate was refused: ") + X509_verify_cert_error_string(verify);
      }
    }
    if (e.code().category() == asio::error::get_ssl_category()) return "TLS: " + e.code().message();
    return e.what();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "unknown failure";
}

}  // namespace agentbox::k8s
