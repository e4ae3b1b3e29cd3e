// For unit tests that change process-wide state (a seccomp filter, Landlock,
// credentials): the body runs in a forked child, which hands back its JSON
// result over a pipe.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace agentbox::linux::testing {

// Runs `body` in a forked child and returns the JSON it produced, or
// {"child": "..."} saying why there is none.
inline nlohmann::json InChild(const std::function<nlohmann::json()>& body) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return nlohmann::json{{"child", "pipe failed"}};
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string out = body().dump();
    (void)!write(fds[1], out.data(), out.size());
    _exit(0);
  }
  close(fds[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) text.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  nlohmann::json result = nlohmann::json::parse(text, nullptr, false);
  if (result.is_discarded()) return nlohmann::json{{"child", "no result"}, {"status", status}};
  return result;
}

}  // namespace agentbox::linux::testing
