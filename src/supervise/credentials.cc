#include "supervise/credentials.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include "confine/layers.h"
#include "linux/fd.h"
#include "net/secrets.h"
#include "net/terminator.h"
#include "net/tls.h"

namespace agentbox::supervise {
namespace {

Status WriteBundle(const std::string& path, const std::string& ca_pem, const std::string& roots_file) {
  std::string content = ca_pem;
  std::ifstream roots(roots_file, std::ios::binary);
  if (roots) {
    std::ostringstream s;
    s << roots.rdbuf();
    content += s.str();
  }
  linux::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444));
  if (!fd.valid()) return Status::Errno("credentials", "open(O_CREAT)", path);
  const char* p = content.data();
  std::size_t left = content.size();
  while (left > 0) {
    ssize_t n = ::write(fd.get(), p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::Errno("credentials", "write", path);
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  return {};
}

}  // namespace

Result<std::shared_ptr<net::Terminator>> PrepareCredentials(Plan* plan, std::shared_ptr<net::SecretStore> given) {
  NetworkPlan& net = plan->network;
  if (!plan->confined || !net.terminate || !net.proxy) return std::shared_ptr<net::Terminator>();
  auto secrets = given ? Result<std::shared_ptr<net::SecretStore>>(std::move(given))
                       : net::SecretStore::Create(net.credentials.secrets);
  if (!secrets.ok()) return secrets.status();
  auto made = net::Terminator::Create(net.credentials, net.http_rules, *secrets, net::TerminatorOptions{});
  if (!made.ok()) return made.status();
  std::shared_ptr<net::Terminator> terminator = std::move(*made);
  const std::string roots = net::DefaultTrustFile();
  if (plan->backend == Backend::kLandlockOnly) {
    net.ca_bundle = plan->private_dir + "/ca-bundle.pem";
    if (Status s = WriteBundle(net.ca_bundle, terminator->ca_pem(), roots); !s.ok()) return s;
    SetTrustEnv(&plan->env, net.ca_bundle);
  } else {
    bool placed = false;
    for (auto& m : plan->mounts) {
      if (m.kind != MountKind::kFile || m.target != net.ca_bundle) continue;
      m.data = terminator->ca_pem();
      m.source = roots;
      placed = true;
    }
    if (!placed) return Status::Error("credentials", "the plan has no place for the CA bundle " + net.ca_bundle);
  }
  const auto& specs = (*secrets)->specs();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].placeholder_env.empty()) continue;
    bool replaced = false;
    for (auto& [k, v] : plan->env.set) {
      if (k == specs[i].placeholder_env) {
        v = (*secrets)->placeholder(i);
        replaced = true;
      }
    }
    if (!replaced) plan->env.set.emplace_back(specs[i].placeholder_env, (*secrets)->placeholder(i));
  }
  return terminator;
}

}  // namespace agentbox::supervise
