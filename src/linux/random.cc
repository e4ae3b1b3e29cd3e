#include "linux/random.h"

#include <sys/random.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <vector>

namespace agentbox::linux {

std::string RandomHex(std::size_t bytes) {
  std::vector<unsigned char> raw(bytes);
  std::size_t got = 0;
  while (got < bytes) {
    ssize_t n = getrandom(raw.data() + got, bytes - got, 0);
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got < bytes) {
    auto v = static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
             (static_cast<unsigned long long>(getpid()) << 32);
    for (std::size_t i = got; i < bytes; ++i) raw[i] = static_cast<unsigned char>(v >> (8 * (i % 8)));
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(bytes * 2);
  for (unsigned char c : raw) {
    s += kHex[c >> 4];
    s += kHex[c & 15];
  }
  return s;
}

}  // namespace agentbox::linux
