#include "net/tls.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdlib>
#include <cstring>

#include "net/rules.h"

namespace agentbox::net {
namespace {

struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;

Status SslError(const std::string& what) { return Status::Error("tls", what + ": " + SslErrors("unknown error")); }

Result<PkeyPtr> NewKey() {
  PkeyPtr key(EVP_EC_gen("P-256"));
  if (!key) return SslError("generating a P-256 key");
  return key;
}

// Adds one extension given in OpenSSL's configuration syntax.
bool AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return false;
  const bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

// A certificate for `subject_cn` with `key`'s public half, issued by
// `issuer` (by itself when null), valid from an hour ago; Sign() signs it.
Result<X509Ptr> NewCertificate(const std::string& subject_cn, EVP_PKEY* key, X509* issuer,
                               int valid_days) {
  X509Ptr cert(X509_new());
  if (!cert) return SslError("X509_new");
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof serial) != 1) return SslError("RAND_bytes");
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  ASN1_INTEGER* sn = bn ? BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get())) : nullptr;
  BN_free(bn);
  if (sn == nullptr) return SslError("serial number");
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(valid_days) * 24 * 3600);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>("agentbox"), -1, -1,
                             0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(subject_cn.c_str()),
                             -1, -1, 0);
  X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : name);
  if (X509_set_pubkey(cert.get(), key) != 1) return SslError("X509_set_pubkey");
  return cert;
}

Status Sign(X509* cert, EVP_PKEY* signer) {
  if (X509_sign(cert, signer, EVP_sha256()) == 0) return SslError("signing a certificate");
  return {};
}

std::string ToPem(X509* cert) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, cert);
  char* data = nullptr;
  long len = BIO_get_mem_data(bio, &data);
  std::string pem(data, static_cast<std::size_t>(len));
  BIO_free(bio);
  return pem;
}

// "DNS:api.test" / "IP:127.0.0.1" for a leaf's subjectAltName.
std::string AltName(const std::string& host) {
  return (IpAddress::Parse(host) ? "IP:" : "DNS:") + host;
}

// A name constraint's permitted subtree: "*.example.com" is every strict
// subdomain (RFC 5280 §4.2.1.10: a leading period); an IP literal is that
// single address.
std::string PermittedSubtree(const std::string& name) {
  if (auto ip = IpAddress::Parse(name)) {
    return "permitted;IP:" + ip->ToString() + (ip->v6 ? "/ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff" : "/255.255.255.255");
  }
  if (name.rfind("*.", 0) == 0) return "permitted;DNS:" + name.substr(1);
  return "permitted;DNS:" + name;
}

int SelectHttp11(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in, unsigned int inlen,
                 void*) {
  static const unsigned char kHttp11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  unsigned char* selected = nullptr;
  if (SSL_select_next_proto(&selected, outlen, kHttp11, sizeof kHttp11, in, inlen) != OPENSSL_NPN_NEGOTIATED) {
    return SSL_TLSEXT_ERR_ALERT_FATAL;
  }
  *out = selected;
  return SSL_TLSEXT_ERR_OK;
}

}  // namespace

std::string SslErrors(const std::string& fallback) {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? fallback : out;
}

struct RunCa::Key {
  PkeyPtr ca_key;
  X509Ptr ca_cert;
  PkeyPtr leaf_key;  // one key for every leaf of this run
};

RunCa::~RunCa() = default;

Result<std::unique_ptr<RunCa>> RunCa::Create(const std::vector<std::string>& names, int valid_days) {
  std::unique_ptr<RunCa> ca(new RunCa());
  ca->key_ = std::make_unique<Key>();
  auto ca_key = NewKey();
  if (!ca_key.ok()) return ca_key.status();
  auto leaf_key = NewKey();
  if (!leaf_key.ok()) return leaf_key.status();
  unsigned char id[6];
  RAND_bytes(id, sizeof id);
  char hex[13];
  for (int i = 0; i < 6; ++i) std::snprintf(hex + 2 * i, 3, "%02x", id[i]);
  auto cert = NewCertificate(std::string("agentbox per-run CA ") + hex, ca_key->get(), nullptr,
                             valid_days);
  if (!cert.ok()) return cert.status();
  X509* c = cert->get();
  if (!AddExtension(c, c, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") ||
      !AddExtension(c, c, NID_key_usage, "critical,keyCertSign,cRLSign") ||
      !AddExtension(c, c, NID_subject_key_identifier, "hash")) {
    return SslError("CA extensions");
  }
  if (!names.empty()) {
    std::string subtrees;
    for (const auto& n : names) subtrees += (subtrees.empty() ? "" : ",") + PermittedSubtree(n);
    if (!AddExtension(c, c, NID_name_constraints, "critical," + subtrees)) return SslError("CA name constraints");
  }
  if (Status s = Sign(c, ca_key->get()); !s.ok()) return s;
  ca->ca_pem_ = ToPem(c);
  ca->key_->ca_key = std::move(*ca_key);
  ca->key_->ca_cert = std::move(*cert);
  ca->key_->leaf_key = std::move(*leaf_key);
  return ca;
}

Result<SSL_CTX*> RunCa::ServerContext(const std::string& host) {
  if (auto it = servers_.find(host); it != servers_.end()) return it->second.get();
  X509* issuer = key_->ca_cert.get();
  auto leaf = NewCertificate(host.substr(0, 64), key_->leaf_key.get(), issuer, 30);
  if (!leaf.ok()) return leaf.status();
  X509* l = leaf->get();
  if (!AddExtension(l, issuer, NID_subject_alt_name, AltName(host)) ||
      !AddExtension(l, issuer, NID_basic_constraints, "critical,CA:FALSE") ||
      !AddExtension(l, issuer, NID_key_usage, "critical,digitalSignature") ||
      !AddExtension(l, issuer, NID_ext_key_usage, "serverAuth") ||
      !AddExtension(l, issuer, NID_authority_key_identifier, "keyid:always")) {
    return SslError("leaf extensions for " + host);
  }
  if (Status s = Sign(l, key_->ca_key.get()); !s.ok()) return s;
  SslCtxPtr ctx(SSL_CTX_new(TLS_server_method()));
  if (!ctx) return SslError("SSL_CTX_new");
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  // A peer that closes without close_notify ends the stream (HTTP frames
  // its own messages); renegotiation and compression are never wanted.
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION | SSL_OP_IGNORE_UNEXPECTED_EOF);
  if (SSL_CTX_use_certificate(ctx.get(), l) != 1 || SSL_CTX_add1_chain_cert(ctx.get(), issuer) != 1 ||
      SSL_CTX_use_PrivateKey(ctx.get(), key_->leaf_key.get()) != 1) {
    return SslError("server certificate for " + host);
  }
  SSL_CTX_set_alpn_select_cb(ctx.get(), SelectHttp11, nullptr);
  // Session tickets would be encrypted with a key OpenSSL makes per
  // context; resumption is not worth a second secret here.
  SSL_CTX_set_num_tickets(ctx.get(), 0);
  SSL_CTX* raw = ctx.get();
  servers_.emplace(host, std::move(ctx));
  return raw;
}

Result<SslCtxPtr> MakeUpstreamContext() {
  SslCtxPtr ctx(SSL_CTX_new(TLS_client_method()));
  if (!ctx) return SslError("SSL_CTX_new");
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION | SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  if (SSL_CTX_set_default_verify_paths(ctx.get()) != 1) return SslError("loading the default trust store");
  static const unsigned char kHttp11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  SSL_CTX_set_alpn_protos(ctx.get(), kHttp11, sizeof kHttp11);
  return ctx;
}

Status PrepareUpstream(SSL* ssl, const std::string& host) {
  if (auto ip = IpAddress::Parse(host)) {
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    if (X509_VERIFY_PARAM_set1_ip_asc(param, ip->ToString().c_str()) != 1) return SslError("verify IP " + host);
    return {};
  }
  if (SSL_set_tlsext_host_name(ssl, host.c_str()) != 1) return SslError("SNI " + host);
  if (SSL_set1_host(ssl, host.c_str()) != 1) return SslError("verify host " + host);
  SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  return {};
}

namespace {

// The host a client connection was made for, on the SSL object.
int HostIndex() {
  static const int index = SSL_get_ex_new_index(
      0, nullptr, nullptr, nullptr, [](void*, void* p, CRYPTO_EX_DATA*, int, long, void*) {
        delete static_cast<std::string*>(p);
      });
  return index;
}

constexpr std::size_t kMaxSessionHosts = 256;

}  // namespace

UpstreamSessions::UpstreamSessions(SSL_CTX* ctx) : ctx_(ctx) {
  SSL_CTX_set_session_cache_mode(ctx_, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
  SSL_CTX_set_app_data(ctx_, this);
  SSL_CTX_sess_set_new_cb(ctx_, &UpstreamSessions::OnNewSession);
}

UpstreamSessions::~UpstreamSessions() {
  SSL_CTX_sess_set_new_cb(ctx_, nullptr);
  SSL_CTX_set_app_data(ctx_, nullptr);
  for (auto& [host, session] : by_host_) SSL_SESSION_free(session);
}

void UpstreamSessions::Offer(SSL* ssl, const std::string& host) {
  SSL_set_ex_data(ssl, HostIndex(), new std::string(host));
  auto it = by_host_.find(host);
  if (it == by_host_.end()) return;
  if (SSL_SESSION_is_resumable(it->second) != 1) {
    SSL_SESSION_free(it->second);
    by_host_.erase(it);
    return;
  }
  SSL_set_session(ssl, it->second);
}

int UpstreamSessions::OnNewSession(SSL* ssl, SSL_SESSION* session) {
  auto* self = static_cast<UpstreamSessions*>(SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl)));
  auto* host = static_cast<std::string*>(SSL_get_ex_data(ssl, HostIndex()));
  if (self == nullptr || host == nullptr) return 0;  // not kept: OpenSSL frees it
  auto it = self->by_host_.find(*host);
  if (it != self->by_host_.end()) {
    SSL_SESSION_free(it->second);
    it->second = session;
  } else {
    if (self->by_host_.size() >= kMaxSessionHosts) {
      SSL_SESSION_free(self->by_host_.begin()->second);
      self->by_host_.erase(self->by_host_.begin());
    }
    self->by_host_.emplace(*host, session);
  }
  return 1;  // kept: the reference is ours
}

std::string DefaultTrustFile() {
  const char* env = std::getenv(X509_get_default_cert_file_env());
  return env != nullptr && *env ? env : X509_get_default_cert_file();
}

}  // namespace agentbox::net
