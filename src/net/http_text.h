// Character-level helpers shared by the proxy's HTTP code (the forward-proxy
// parser, the terminated-stream head and the L7 rules): RFC 9110 tokens,
// case-insensitive field names, optional whitespace. Pure, header-only.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>

namespace agentbox::net {

// ASCII case-insensitive equality (field names, Transfer-Encoding codings).
inline bool IEquals(std::string_view a, std::string_view b) {
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [&](char x, char y) { return lower(x) == lower(y); });
}

// Beast's string view (boost::string_view in Boost 1.74) as a std::string_view.
template <class View>
std::string_view SV(View s) {
  return {s.data(), s.size()};
}

// OWS (SP / HTAB) removed from both ends.
inline std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// tchar (RFC 9110 §5.6.2): "!#$%&'*+-.^_`|~", digits and letters.
inline bool IsTokenChar(char c) {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

inline bool IsToken(std::string_view s) { return !s.empty() && std::all_of(s.begin(), s.end(), IsTokenChar); }

// Text from the sandbox (a field name, a path) fit for a one-line reason:
// bytes outside printable ASCII become '?', and it is cut at `max`.
inline std::string Printable(std::string_view s, std::size_t max = 64) {
  std::string out;
  for (char c : s.substr(0, max)) out += (c > 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > max) out += "...";
  return out;
}

}  // namespace agentbox::net
