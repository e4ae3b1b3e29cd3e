#include "supervise/egress.h"

#include <pthread.h>
#include <signal.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <chrono>
#include <fstream>
#include <future>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "linux/descendants.h"
#include "linux/loopback_peer.h"
#include "linux/proxy_listeners.h"
#include "net/ask.h"
#include "net/dns.h"
#include "net/proxy.h"
#include "net/rules.h"
#include "supervise/broker.h"

namespace agentbox::supervise {
namespace {

class CollectingSink : public net::RecordSink {
 public:
  void Record(const net::ConnectionRecord& record) override {
    if (forward_) {  // a long-lived sandbox: handed on as they come, not kept
      forward_(record.ToJson());
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    records_.push_back(record);
  }
  void Forward(std::function<void(const std::string&)> to) { forward_ = std::move(to); }
  std::vector<net::ConnectionRecord> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(records_);
  }

 private:
  std::mutex mu_;
  std::vector<net::ConnectionRecord> records_;
  std::function<void(const std::string&)> forward_;
};

}  // namespace

// Declaration order is destruction order reversed: the proxy goes first,
// then the asker and the resolver (whose threads post to the io_context),
// then the io_context itself.
struct Egress::State {
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work{io.get_executor()};
  std::unique_ptr<net::SystemResolver> resolver;
  std::unique_ptr<net::Asker> asker;
  CollectingSink sink;
  std::unique_ptr<net::RuleSet> rules;  // replaced in place by SetRules (the broker holds its address)
  NetDefault default_verdict = NetDefault::kDeny;
  net::AddressBook book;
  std::unordered_set<std::string> approved;  // names allowed when the DNS asked
  // Names refused when the DNS asked, and until when the answer stands: one
  // lookup (A and AAAA, a resolver's retries) is one question.
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> refused_answers;
  std::unique_ptr<net::Proxy> proxy;
  std::unique_ptr<net::DnsServer> dns;
  std::unique_ptr<ConnectBroker> broker;
  std::thread thread;
  bool stopped = false;
  std::vector<net::ConnectionRecord> records;
};

namespace {

// Whether `host` matches an inspect_tls entry (a name, or "*.suffix").
bool Inspected(const NetworkPlan& n, const std::string& host) {
  if (n.inspect_tls_all) return true;
  for (const auto& p : n.inspect_tls) {
    if (p.rfind("*.", 0) == 0) {
      const std::string suffix = p.substr(1);
      if (host.size() > suffix.size() && host.ends_with(suffix)) return true;
    } else if (host == p) {
      return true;
    }
  }
  return false;
}

// How long a "no" to a name's question answers its lookups without asking.
constexpr std::chrono::seconds kAnswerStands{30};

// The DNS's question to the rules: may the sandbox know this name?
void DecideName(Egress::State& s, const NetworkPlan& n, const std::string& name,
                std::function<void(net::DnsVerdict)> done) {
  net::Decision d = s.rules->DecideName(name);
  if (d.verdict == net::Verdict::kAllow) return done({true, d.rule, "", ""});
  if (d.verdict == net::Verdict::kUnknown && s.approved.count(name)) return done({true, "on_unknown_domain: ask", "", ""});
  const bool off = n.allow.empty() && !n.default_allow && !n.ask_unknown;
  auto deny = [name, off](const net::Decision& why) {
    net::DnsVerdict v;
    v.rule = why.rule;
    v.reason = ToString(why.reason);
    v.message = off ? "dns: " + name + " not resolved: networking is off by policy (network.allow is empty, "
                                       "network.default: deny)"
                    : "dns: " + name + " not allowed by " +
                          (why.reason == net::DenyReason::kDenyRule ? "network.deny entry \"" + why.rule + "\""
                           : why.reason == net::DenyReason::kAskDenied ? std::string("the answer to the question")
                                                                        : std::string("network.allow"));
    return v;
  };
  if (d.verdict == net::Verdict::kDeny || !n.ask_unknown || !s.asker) return done(deny(d));
  const net::Decision said_no = net::Decision::Deny(net::DenyReason::kAskDenied, "on_unknown_domain: ask", "");
  const auto now = std::chrono::steady_clock::now();
  if (auto it = s.refused_answers.find(name); it != s.refused_answers.end()) {
    if (now < it->second) return done(deny(said_no));
    s.refused_answers.erase(it);
  }
  s.asker->Ask(name, 0, [&s, name, done, deny, said_no](net::AskAnswer a) {
    if (a == net::AskAnswer::kDeny) {
      if (s.refused_answers.size() < 4096) s.refused_answers[name] = std::chrono::steady_clock::now() + kAnswerStands;
      return done(deny(said_no));
    }
    s.approved.insert(name);
    done({true, "on_unknown_domain: ask", "", ""});
  });
}

}  // namespace

Result<std::unique_ptr<Egress>> Egress::Start(const Plan& plan, const RunOptions& options, Fds fds,
                                              pid_t served_root, std::shared_ptr<net::Terminator> terminator,
                                              std::function<bool(int)> admit) {
  auto rules = net::RuleSet::Build(plan.network.allow, plan.network.deny,
                                   plan.network.default_allow ? NetDefault::kAllow : NetDefault::kDeny);
  if (!rules.ok()) return Status::Error("network", rules.status().message());
  std::unique_ptr<Egress> e(new Egress());
  e->state_ = std::make_unique<State>();
  State& s = *e->state_;
  s.rules = std::make_unique<net::RuleSet>(*rules);
  s.default_verdict = plan.network.default_allow ? NetDefault::kAllow : NetDefault::kDeny;
  s.resolver = std::make_unique<net::SystemResolver>(s.io);
  if (options.on_connection) s.sink.Forward(options.on_connection);
  const std::chrono::milliseconds ask_timeout(options.ask_timeout_ms);
  if (plan.network.ask_unknown) {
    // --ask-command first; else the controlling terminal, if there is one
    // (and the caller may use it); else no asker, and every question is a deny.
    if (!options.ask_command.empty()) {
      s.asker = std::make_unique<net::CommandAsker>(s.io, std::vector<std::string>{options.ask_command}, ask_timeout);
    } else if (options.ask_on_terminal) {
      s.asker = net::TerminalAsker::OpenControllingTerminal(s.io, ask_timeout);
    }
  }
  net::ProxyOptions popts;
  popts.ask_unknown = plan.network.ask_unknown;
  // The asker's own bound answers first (the terminal says so, the ask
  // command is killed); the proxy's is a backstop behind it.
  popts.ask_timeout = ask_timeout + std::chrono::seconds(1);
  popts.check_sni = plan.network.sni_check;
  popts.sni_ports = plan.network.sni_ports;
  const bool terminating = terminator != nullptr;
  popts.terminator = std::move(terminator);
  if (served_root > 0) {
    popts.admit = [served_root](int fd) { return linux::LoopbackPeerBelow(served_root, fd); };
  } else if (admit) {
    popts.admit = std::move(admit);
  }
  s.proxy = std::make_unique<net::Proxy>(s.io, *rules, popts, *s.resolver, s.asker.get(), &s.sink);
  // Not yet running: set up on this thread, before the proxy's thread starts.
  if (fds.http.valid()) {
    if (Status st = s.proxy->Serve(fds.http.release(), net::ListenerKind::kHttp); !st.ok()) return st;
  }
  if (fds.socks.valid()) {
    if (Status st = s.proxy->Serve(fds.socks.release(), net::ListenerKind::kSocks5); !st.ok()) return st;
  }
  if (fds.dns_udp.valid() && fds.dns_tcp.valid()) {
    const NetworkPlan& n = plan.network;
    State* sp = &s;
    s.dns = std::make_unique<net::DnsServer>(
        s.io, *s.resolver,
        [sp, n](const std::string& name, std::function<void(net::DnsVerdict)> done) {
          DecideName(*sp, n, name, std::move(done));
        },
        [sp](const std::string& name, const net::DnsVerdict& v, std::uint64_t count) {
          net::ConnectionRecord r;
          r.protocol = "dns";
          r.host = name;
          r.port = 53;
          r.decision = "deny";
          r.rule = v.rule;
          r.reason = v.reason;
          r.message = v.message;
          r.count = count;
          sp->sink.Record(r);
        },
        s.book);
    if (Status st = s.dns->ServeUdp(fds.dns_udp.release()); !st.ok()) return st;
    if (Status st = s.dns->ServeTcp(fds.dns_tcp.release()); !st.ok()) return st;
  }
  if (fds.broker.valid()) {
    BrokerDeps deps;
    deps.rules = s.rules.get();
    deps.book = &s.book;
    deps.approved = &s.approved;
    deps.proxy = s.proxy.get();
    deps.sink = &s.sink;
    const bool inspect = plan.network.inspect_tls_all || !plan.network.inspect_tls.empty();
    if (terminating || inspect) {
      // The relay's door for brokered connections: on the supervisor's own
      // loopback, where only connections announced by the broker are served.
      auto adopt = linux::BindHostProxyListeners();
      if (!adopt.ok()) return adopt.status();
      deps.adopt_port = adopt->ports.http_port;
      if (Status st = s.proxy->Serve(adopt->http.release(), net::ListenerKind::kAdopted); !st.ok()) return st;
      const net::Terminator* t = popts.terminator.get();
      const NetworkPlan n = plan.network;
      deps.relay = [t, n](const std::string& host) { return (t && t->Covers(host)) || Inspected(n, host); };
    }
    if (plan.network.dns_address.empty()) {
      deps.resolver = s.resolver.get();
      for (const auto& rule : s.rules->allow()) {
        if (rule.kind == net::RuleKind::kExactHost) deps.preresolve.push_back(rule.host);
      }
    }
    s.broker = std::make_unique<ConnectBroker>(s.io, std::move(fds.broker), std::move(deps));
    s.broker->Start();
  }
  s.thread = std::thread([&s] {
    // A peer that closes early must not kill the supervisor.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    s.io.run();
  });
  return e;
}

Egress::~Egress() { Stop(); }

void Egress::Stop() {
  if (!state_ || state_->stopped) return;
  State& s = *state_;
  s.stopped = true;
  if (s.thread.joinable()) {
    std::promise<void> done;
    boost::asio::post(s.io, [&] {
      if (s.broker) s.broker->Stop();
      if (s.dns) s.dns->Stop();
      s.proxy->Stop();
      done.set_value();
    });
    done.get_future().wait();
    s.work.reset();
    s.io.stop();
    s.thread.join();
  } else {
    if (s.broker) s.broker->Stop();
    if (s.dns) s.dns->Stop();
    s.proxy->Stop();
  }
  s.records = s.sink.Take();
}

Status Egress::SetRules(const std::vector<std::string>& allow, const std::vector<std::string>& deny,
                        pid_t sandbox_root) {
  if (!state_ || state_->stopped) return Status::Error("network", "the sandbox's egress is stopped");
  State& s = *state_;
  auto rules = net::RuleSet::Build(allow, deny, s.default_verdict);
  if (!rules.ok()) return Status::Error("network", rules.status().message());
  std::vector<std::uint64_t> revoked;
  auto apply = [&s, &rules, &revoked] {
    *s.rules = *rules;
    s.proxy->SetRules(*rules);
    if (s.broker) revoked = s.broker->Revoke();
  };
  if (!s.thread.joinable()) {
    apply();
  } else {
    std::promise<void> done;
    boost::asio::post(s.io, [&] {
      apply();
      done.set_value();
    });
    done.get_future().wait();
  }
  // The broker's direct connections are the sandbox's own sockets: ended
  // through a copy of the descriptor that holds them.
  if (!revoked.empty() && sandbox_root > 0) (void)linux::ShutDownHeldSockets(sandbox_root, revoked);
  return {};
}

const std::vector<net::ConnectionRecord>& Egress::records() const { return state_->records; }

void AddNetworkReport(const std::vector<net::ConnectionRecord>& records, Outcome* out) {
  constexpr size_t kMaxNetworkDenials = 32;
  constexpr size_t kMaxCredentialUses = 64;
  NetworkConnections sum;
  std::vector<Denial> denials;
  auto add_denial = [&](Denial d) {
    for (auto& e : denials) {
      if (e.facet == d.facet && e.op == d.op && e.target == d.target && e.reason == d.reason) {
        e.count += d.count;
        return;
      }
    }
    if (denials.size() < kMaxNetworkDenials) denials.push_back(std::move(d));
  };
  auto add_use = [&](CredentialUse u) {
    for (auto& e : out->credential_uses) {
      if (e.secret == u.secret && e.host == u.host && e.method == u.method && e.path == u.path &&
          e.decision == u.decision) {
        ++e.count;
        return;
      }
    }
    if (out->credential_uses.size() < kMaxCredentialUses) out->credential_uses.push_back(std::move(u));
  };
  for (const auto& r : records) {
    sum.bytes_up += r.bytes_up;
    sum.bytes_down += r.bytes_down;
    const std::string target = r.host + ":" + std::to_string(r.port);
    if (r.decision == "allow") {
      ++sum.allowed;
    } else if (r.decision == "deny") {
      ++sum.denied;
    } else {
      ++sum.errors;
    }
    // Requests decided one by one (the terminator, or a placeholder in a
    // proxy request's head): each refusal is a denial of its own facet.
    bool request_denial = false;
    for (const auto& q : r.requests) {
      for (const auto& secret : q.secrets) add_use({secret, r.host, q.method, q.path, q.decision, 1});
      if (q.decision != "deny") continue;
      request_denial = true;
      std::string reason = q.reason;
      if (!q.rule.empty()) reason += " (rule: " + q.rule + ")";
      std::string what = q.op == "git-push" ? target + " " + q.path : target;
      add_denial({q.facet.empty() ? "network" : q.facet, q.op.empty() ? "request" : q.op, what, reason, "proxy", 1});
    }
    if (r.protocol == "dns") {
      // Refused names: counted, not connections.
      sum.denied += r.count - 1;
      add_denial({"network", "dns", r.host, r.message, "dns", r.count});
      continue;
    }
    if (r.decision == "deny" && !request_denial) {
      std::string reason = r.reason;
      if (!r.message.empty()) reason += ": " + r.message;
      if (!r.rule.empty()) reason += " (rule: " + r.rule + ")";
      add_denial({"network", "connect", target, reason, r.protocol == "connect" ? "broker" : "proxy", 1});
    }
  }
  out->network = sum;
  out->denials.insert(out->denials.begin(), denials.begin(), denials.end());
}

Status WriteNetworkLog(const std::string& path, const std::vector<net::ConnectionRecord>& records) {
  std::ofstream f(path, std::ios::trunc);
  for (const auto& r : records) f << r.ToJson() << "\n";
  f.flush();
  if (!f) return Status::Error("network", "could not write the network log to " + path);
  return {};
}

}  // namespace agentbox::supervise
