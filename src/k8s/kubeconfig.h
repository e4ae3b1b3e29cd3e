// A kubeconfig file resolved for one context: the API server's URL, how its
// certificate is verified, and the credential presented to it.
//
// Only what a client can use without running anything is accepted: a bearer
// token (inline or from tokenFile) or a client certificate and key. An exec
// or auth-provider plugin, basic auth, a proxy-url and
// insecure-skip-tls-verify are refused with the context named, never
// skipped: a silent fallback would talk to the cluster as someone else or
// without checking who answers.
//
// Plain data once loaded; no network. Thread-compatible.
#pragma once

#include <string>

#include "agentbox/status.h"

namespace agentbox::k8s {

struct Kubeconfig {
  std::string path;     // the file it came from
  std::string context;  // the context resolved ("" asked = current-context)
  std::string cluster;  // the context's cluster entry
  std::string user;     // the context's user entry ("" = none)

  // https://HOST[:PORT][/PREFIX], without a trailing slash.
  std::string server;
  std::string host;    // from `server`; an IPv6 literal without brackets
  std::string port;    // "443" when the URL names none
  std::string prefix;  // a path the API is served below ("" usually)
  // tls-server-name: the name the certificate must carry instead of `host`.
  std::string tls_server_name;

  // PEM: certificate-authority-data, or the certificate-authority file's
  // contents. Empty: the system's trust store verifies the server.
  std::string ca_pem;
  std::string token;            // bearer token ("" = none)
  std::string client_cert_pem;  // client certificate (chain), PEM ("" = none)
  std::string client_key_pem;   // its private key, PEM

  // The name the server's certificate must carry.
  const std::string& verify_name() const { return tls_server_name.empty() ? host : tls_server_name; }
};

// The file a kubeconfig is read from: `path` if set ("~/" expanded), else
// the first entry of $KUBECONFIG, else ~/.kube/config.
Result<std::string> KubeconfigPath(const std::string& path);

// Loads `path` (as KubeconfigPath resolves it) and resolves `context` ("" =
// its current-context). Relative file names inside are taken relative to
// the kubeconfig's directory, as kubectl does. Errors name the file, the
// context and the key that is missing or refused.
Result<Kubeconfig> LoadKubeconfig(const std::string& path, const std::string& context);

// The same from YAML text; `path` names it in errors and anchors relative
// file names.
Result<Kubeconfig> ParseKubeconfig(const std::string& yaml, const std::string& path, const std::string& context);

}  // namespace agentbox::k8s
