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

#include "linux/loopback_peer.h"
#include "net/ask.h"
#include "net/proxy.h"
#include "net/rules.h"

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
  std::unique_ptr<net::Proxy> proxy;
  std::thread thread;
  bool stopped = false;
  std::vector<net::ConnectionRecord> records;
};

Result<std::unique_ptr<Egress>> Egress::Start(const Plan& plan, const RunOptions& options, linux::UniqueFd http,
                                              linux::UniqueFd socks, pid_t served_root,
                                              std::shared_ptr<net::Terminator> terminator) {
  auto rules = net::RuleSet::Build(plan.network.allow, plan.network.deny,
                                   plan.network.default_allow ? NetDefault::kAllow : NetDefault::kDeny);
  if (!rules.ok()) return Status::Error("network", rules.status().message());
  std::unique_ptr<Egress> e(new Egress());
  e->state_ = std::make_unique<State>();
  State& s = *e->state_;
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
  popts.terminator = std::move(terminator);
  if (served_root > 0) {
    popts.admit = [served_root](int fd) { return linux::LoopbackPeerBelow(served_root, fd); };
  }
  s.proxy = std::make_unique<net::Proxy>(s.io, std::move(*rules), popts, *s.resolver, s.asker.get(), &s.sink);
  // Not yet running: set up on this thread, before the proxy's thread starts.
  if (Status st = s.proxy->Serve(http.release(), net::ListenerKind::kHttp); !st.ok()) return st;
  if (Status st = s.proxy->Serve(socks.release(), net::ListenerKind::kSocks5); !st.ok()) return st;
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
      s.proxy->Stop();
      done.set_value();
    });
    done.get_future().wait();
    s.work.reset();
    s.io.stop();
    s.thread.join();
  } else {
    s.proxy->Stop();
  }
  s.records = s.sink.Take();
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
        ++e.count;
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
    if (r.decision == "deny" && !request_denial) {
      std::string reason = r.reason;
      if (!r.message.empty()) reason += ": " + r.message;
      if (!r.rule.empty()) reason += " (rule: " + r.rule + ")";
      add_denial({"network", "connect", target, reason, "proxy", 1});
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
