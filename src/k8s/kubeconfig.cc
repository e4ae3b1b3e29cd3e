#include "k8s/kubeconfig.h"

#include <openssl/evp.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "confine/paths.h"
#include "linux/user_dirs.h"

namespace agentbox::k8s {
namespace {

constexpr const char* kKubeconfigStage = "kubeconfig";

// Standard base64 as kubeconfig *-data fields carry it (whitespace allowed).
bool DecodeBase64(const std::string& in, std::string& out) {
  std::string clean;
  for (char c : in) {
    if (c != '\n' && c != '\r' && c != ' ' && c != '\t') clean += c;
  }
  if (clean.size() % 4 != 0) return false;
  out.assign(clean.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(clean.data()), static_cast<int>(clean.size()));
  if (n < 0) return false;
  // EVP_DecodeBlock counts the padding as decoded zero bytes.
  std::size_t len = static_cast<std::size_t>(n);
  for (std::size_t i = clean.size(); i > 0 && clean[i - 1] == '='; --i) --len;
  out.resize(len);
  return true;
}

Result<std::string> ReadWhole(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Errno(kKubeconfigStage, "open", path).WithContext(what);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Resolve(const std::string& file, const std::string& kubeconfig_path) {
  if (file.empty() || file[0] == '/') return file;
  if (file.rfind("~/", 0) == 0) return paths::ExpandHome(file, linux::HomeDir());
  return paths::Join(paths::Parent(kubeconfig_path), file);
}

// The entry called `name` in the list `key` ("clusters", "users",
// "contexts"), its inner map (`inner`), or an undefined node.
YAML::Node Find(const YAML::Node& root, const char* key, const char* inner, const std::string& name) {
  const YAML::Node list = root[key];
  if (!list || !list.IsSequence()) return YAML::Node(YAML::NodeType::Undefined);
  for (const auto& entry : list) {
    if (entry.IsMap() && entry["name"] && entry["name"].as<std::string>() == name) {
      YAML::Node body = entry[inner];
      return body ? body : YAML::Node(YAML::NodeType::Map);
    }
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

std::string Str(const YAML::Node& map, const char* key) {
  const YAML::Node n = map[key];
  return n && n.IsScalar() ? n.as<std::string>() : "";
}

// PEM from `<key>-data` (base64) or from the file `<key>`; "" when neither.
Result<std::string> PemFrom(const YAML::Node& map, const std::string& key, const Kubeconfig& k,
                            const std::string& where) {
  const std::string data = Str(map, (key + "-data").c_str());
  if (!data.empty()) {
    std::string pem;
    if (!DecodeBase64(data, pem)) {
      return Status::Error(kKubeconfigStage, k.path + ": " + where + ": " + key + "-data is not valid base64");
    }
    return pem;
  }
  const std::string file = Str(map, key.c_str());
  if (file.empty()) return std::string();
  return ReadWhole(Resolve(file, k.path), k.path + ": " + where + ": " + key);
}

Status ParseServer(Kubeconfig& k, const std::string& where) {
  std::string rest;
  if (k.server.rfind("https://", 0) == 0) {
    rest = k.server.substr(8);
  } else {
    return Status::Error(kKubeconfigStage, k.path + ": " + where + ": server '" + k.server +
                                               "' is not an https:// URL; agentbox sends credentials only over TLS");
  }
  const auto slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  k.prefix = slash == std::string::npos ? "" : rest.substr(slash);
  while (!k.prefix.empty() && k.prefix.back() == '/') k.prefix.pop_back();
  if (!authority.empty() && authority[0] == '[') {
    const auto close = authority.find(']');
    if (close == std::string::npos)
      return Status::Error(kKubeconfigStage, k.path + ": " + where + ": bad server " + k.server);
    k.host = authority.substr(1, close - 1);
    const std::string after = authority.substr(close + 1);
    k.port = after.size() > 1 && after[0] == ':' ? after.substr(1) : "443";
  } else {
    const auto colon = authority.rfind(':');
    k.host = authority.substr(0, colon);
    k.port = colon == std::string::npos ? "443" : authority.substr(colon + 1);
  }
  if (k.host.empty() || k.port.empty() || k.port.find_first_not_of("0123456789") != std::string::npos) {
    return Status::Error(kKubeconfigStage, k.path + ": " + where + ": bad server " + k.server);
  }
  return Status();
}

Status ReadCluster(const YAML::Node& cluster, Kubeconfig& k) {
  const std::string where = "cluster '" + k.cluster + "' (context '" + k.context + "')";
  k.server = Str(cluster, "server");
  while (!k.server.empty() && k.server.back() == '/') k.server.pop_back();
  if (k.server.empty()) return Status::Error(kKubeconfigStage, k.path + ": " + where + " has no server");
  if (Status s = ParseServer(k, where); !s.ok()) return s;
  if (Str(cluster, "insecure-skip-tls-verify") == "true") {
    return Status::Error(kKubeconfigStage,
                         k.path + ": " + where +
                             " sets insecure-skip-tls-verify; agentbox refuses to send credentials to a server "
                             "it cannot verify (give certificate-authority or certificate-authority-data)");
  }
  if (!Str(cluster, "proxy-url").empty()) {
    return Status::Error(kKubeconfigStage, k.path + ": " + where + " sets proxy-url, which agentbox does not support");
  }
  k.tls_server_name = Str(cluster, "tls-server-name");
  auto ca = PemFrom(cluster, "certificate-authority", k, where);
  if (!ca.ok()) return ca.status();
  k.ca_pem = std::move(*ca);
  return Status();
}

Status ReadUser(const YAML::Node& user, Kubeconfig& k) {
  const std::string where = "user '" + k.user + "' (context '" + k.context + "')";
  if (user["exec"]) {
    return Status::Error(kKubeconfigStage,
                         k.path + ": " + where +
                             " uses an exec credential plugin; agentbox runs no plugins: give the context a "
                             "token, tokenFile or client certificate");
  }
  if (user["auth-provider"]) {
    return Status::Error(kKubeconfigStage,
                         k.path + ": " + where +
                             " uses an auth-provider plugin; agentbox runs no plugins: give the context a "
                             "token, tokenFile or client certificate");
  }
  if (!Str(user, "username").empty() || !Str(user, "password").empty()) {
    return Status::Error(
        kKubeconfigStage,
        k.path + ": " + where + " uses basic auth (username/password), which Kubernetes removed in 1.19");
  }
  k.token = Str(user, "token");
  if (k.token.empty() && !Str(user, "tokenFile").empty()) {
    auto token = ReadWhole(Resolve(Str(user, "tokenFile"), k.path), k.path + ": " + where + ": tokenFile");
    if (!token.ok()) return token.status();
    k.token = std::move(*token);
    while (!k.token.empty() && (k.token.back() == '\n' || k.token.back() == '\r' || k.token.back() == ' ')) {
      k.token.pop_back();
    }
    if (k.token.empty()) return Status::Error(kKubeconfigStage, k.path + ": " + where + ": tokenFile is empty");
  }
  auto cert = PemFrom(user, "client-certificate", k, where);
  if (!cert.ok()) return cert.status();
  auto key = PemFrom(user, "client-key", k, where);
  if (!key.ok()) return key.status();
  k.client_cert_pem = std::move(*cert);
  k.client_key_pem = std::move(*key);
  if (k.client_cert_pem.empty() != k.client_key_pem.empty()) {
    return Status::Error(kKubeconfigStage, k.path + ": " + where + " has " +
                                               (k.client_cert_pem.empty() ? "client-key without client-certificate"
                                                                          : "client-certificate without client-key"));
  }
  if (k.token.empty() && k.client_cert_pem.empty()) {
    return Status::Error(kKubeconfigStage, k.path + ": " + where + " has no token, tokenFile or client-certificate");
  }
  return Status();
}

}  // namespace

Result<std::string> KubeconfigPath(const std::string& path) {
  if (!path.empty()) {
    const std::string p = paths::ExpandHome(path, linux::HomeDir());
    if (p.empty()) return Status::Error(kKubeconfigStage, "cannot expand " + path + ": no home directory");
    return p;
  }
  if (const char* env = std::getenv("KUBECONFIG"); env && *env) {
    const std::string list = env;
    const std::string first = list.substr(0, list.find(':'));
    if (!first.empty()) return first;
  }
  const std::string home = linux::HomeDir();
  if (home.empty())
    return Status::Error(kKubeconfigStage, "no kubeconfig: neither $KUBECONFIG nor a home directory is set");
  return home + "/.kube/config";
}

Result<Kubeconfig> LoadKubeconfig(const std::string& path, const std::string& context) {
  auto file = KubeconfigPath(path);
  if (!file.ok()) return file.status();
  auto text = ReadWhole(*file, "kubeconfig");
  if (!text.ok()) return text.status();
  return ParseKubeconfig(*text, *file, context);
}

Result<Kubeconfig> ParseKubeconfig(const std::string& yaml, const std::string& path, const std::string& context) {
  Kubeconfig k;
  k.path = path;
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return Status::Error(kKubeconfigStage, path + ": not YAML: " + e.what());
  }
  if (!root.IsMap()) return Status::Error(kKubeconfigStage, path + ": not a kubeconfig (no mapping at the top)");
  try {
    k.context = context.empty() ? Str(root, "current-context") : context;
    if (k.context.empty()) {
      return Status::Error(kKubeconfigStage, path + ": no context given and no current-context set");
    }
    const YAML::Node ctx = Find(root, "contexts", "context", k.context);
    if (!ctx) return Status::Error(kKubeconfigStage, path + ": no context named '" + k.context + "'");
    k.cluster = Str(ctx, "cluster");
    k.user = Str(ctx, "user");
    if (k.cluster.empty())
      return Status::Error(kKubeconfigStage, path + ": context '" + k.context + "' names no cluster");
    const YAML::Node cluster = Find(root, "clusters", "cluster", k.cluster);
    if (!cluster) {
      return Status::Error(kKubeconfigStage, path + ": context '" + k.context + "' names cluster '" + k.cluster +
                                                 "', which is not in clusters");
    }
    if (Status s = ReadCluster(cluster, k); !s.ok()) return s;
    if (k.user.empty()) return Status::Error(kKubeconfigStage, path + ": context '" + k.context + "' names no user");
    const YAML::Node user = Find(root, "users", "user", k.user);
    if (!user) {
      return Status::Error(kKubeconfigStage,
                           path + ": context '" + k.context + "' names user '" + k.user + "', which is not in users");
    }
    if (Status s = ReadUser(user, k); !s.ok()) return s;
  } catch (const YAML::Exception& e) {
    return Status::Error(kKubeconfigStage, path + ": context '" + k.context + "': " + e.what());
  }
  return k;
}

}  // namespace agentbox::k8s
