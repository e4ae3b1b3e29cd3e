// order_trace: which functions of a program run, in the order they first
// run, for the linker's start-up order (scripts/startup-order.sh).
//
//   order_trace FUNCTIONS OUT -- PROGRAM [ARG...]
//
// FUNCTIONS holds "address name" lines (nm's defined text symbols of
// PROGRAM). PROGRAM runs traced, it and every process it forks or clones;
// each process that executes PROGRAM again is traced the same way. Each
// function's first instruction is replaced by a breakpoint (int3); the first
// process to reach it restores the instruction there, has its name appended
// to OUT, and goes on. A function then costs one trap in all, which is what
// lets a whole run be traced at its own pace. Exits with PROGRAM's status.
//
// A tool for the build's maintainers, never part of a run: it needs ptrace
// over PROGRAM (root, or the same user with ptrace allowed).
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace {

struct Function {
  std::vector<std::string> names;  // aliases at one address
  unsigned char first_byte = 0;    // the instruction byte the breakpoint replaced
  bool reported = false;
};

std::map<std::uintptr_t, Function> g_functions;

std::string ExeOf(pid_t pid) {
  char buf[4096];
  const std::string link = "/proc/" + std::to_string(pid) + "/exe";
  const ssize_t n = readlink(link.c_str(), buf, sizeof buf - 1);
  return n < 0 ? std::string() : std::string(buf, static_cast<size_t>(n));
}

// Puts a breakpoint at every function entry of pid's image of PROGRAM.
void Arm(pid_t pid) {
  for (auto& [address, fn] : g_functions) {
    errno = 0;
    long word = ptrace(PTRACE_PEEKTEXT, pid, reinterpret_cast<void*>(address), nullptr);
    if (errno != 0) continue;
    fn.first_byte = static_cast<unsigned char>(word & 0xff);
    word = (word & ~0xffL) | 0xcc;
    ptrace(PTRACE_POKETEXT, pid, reinterpret_cast<void*>(address), reinterpret_cast<void*>(word));
  }
}

// A breakpoint of ours hit at address - 1: restore the instruction in this
// address space, record the function once, and rewind to it.
bool TakeBreakpoint(pid_t pid, std::ofstream& out) {
  struct user_regs_struct regs {};
  if (ptrace(PTRACE_GETREGS, pid, nullptr, &regs) != 0) return false;
  auto it = g_functions.find(static_cast<std::uintptr_t>(regs.rip - 1));
  if (it == g_functions.end()) return false;
  auto* at = reinterpret_cast<void*>(it->first);
  errno = 0;
  long word = ptrace(PTRACE_PEEKTEXT, pid, at, nullptr);
  if (errno == 0 && (word & 0xff) == 0xcc) {
    word = (word & ~0xffL) | it->second.first_byte;
    ptrace(PTRACE_POKETEXT, pid, at, reinterpret_cast<void*>(word));
  }
  if (!it->second.reported) {
    it->second.reported = true;
    for (const auto& name : it->second.names) out << name << '\n';
  }
  regs.rip -= 1;
  ptrace(PTRACE_SETREGS, pid, nullptr, &regs);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5 || std::strcmp(argv[3], "--") != 0) {
    std::cerr << "usage: order_trace FUNCTIONS OUT -- PROGRAM [ARG...]\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  std::string address, name;
  while (in >> address >> name) g_functions[std::stoull(address, nullptr, 16)].names.push_back(name);
  if (g_functions.empty()) {
    std::cerr << "order_trace: no functions in " << argv[1] << "\n";
    return 2;
  }
  std::ofstream out(argv[2]);
  if (!out) {
    std::cerr << "order_trace: cannot write " << argv[2] << "\n";
    return 2;
  }
  char resolved[4096];
  if (realpath(argv[4], resolved) == nullptr) {
    std::cerr << "order_trace: " << argv[4] << ": " << std::strerror(errno) << "\n";
    return 2;
  }
  const std::string program = resolved;

  const pid_t child = fork();
  if (child == 0) {
    ptrace(PTRACE_TRACEME, 0, nullptr, nullptr);
    raise(SIGSTOP);
    execv(argv[4], argv + 4);
    _exit(127);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ptrace(PTRACE_SETOPTIONS, child, nullptr,
         PTRACE_O_TRACECLONE | PTRACE_O_TRACEFORK | PTRACE_O_TRACEVFORK | PTRACE_O_TRACEEXEC | PTRACE_O_EXITKILL);
  ptrace(PTRACE_CONT, child, nullptr, nullptr);

  int exit_code = 1;
  for (;;) {
    const pid_t pid = waitpid(-1, &status, __WALL);
    if (pid < 0) break;
    if (WIFEXITED(status) || WIFSIGNALED(status)) {
      if (pid == child) exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      continue;
    }
    if (!WIFSTOPPED(status)) continue;
    const int signal = WSTOPSIG(status);
    const int event = status >> 16;
    if (event != 0) {
      if (event == PTRACE_EVENT_EXEC && ExeOf(pid) == program) Arm(pid);
      ptrace(PTRACE_CONT, pid, nullptr, nullptr);
    } else if (signal == SIGTRAP && TakeBreakpoint(pid, out)) {
      ptrace(PTRACE_CONT, pid, nullptr, nullptr);
    } else if (signal == SIGSTOP || signal == SIGTRAP) {
      ptrace(PTRACE_CONT, pid, nullptr, nullptr);  // a new process's first stop
    } else {
      ptrace(PTRACE_CONT, pid, nullptr, reinterpret_cast<void*>(static_cast<long>(signal)));
    }
  }
  return exit_code;
}
