#include <algorithm>

#include "daemon/http.h"
#include "report/json_text.h"

namespace agentbox::daemon {
namespace {

std::vector<std::string> Split(std::string_view path) {
  std::vector<std::string> out;
  size_t start = 1;  // paths begin with '/'
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string_view::npos) slash = path.size();
    out.emplace_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  return out;
}

bool IsPlaceholder(const std::string& s) { return s.size() > 2 && s.front() == '{' && s.back() == '}'; }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Matches `segments` against a route; fills `params` on success.
bool Match(const std::vector<std::string>& pattern, const std::vector<std::string>& segments,
           std::vector<std::string>* params) {
  if (pattern.size() != segments.size()) return false;
  std::vector<std::string> found;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (IsPlaceholder(pattern[i])) {
      std::string decoded;
      if (segments[i].empty() || !PercentDecode(segments[i], &decoded)) return false;
      found.push_back(std::move(decoded));
    } else if (pattern[i] != segments[i]) {
      return false;
    }
  }
  *params = std::move(found);
  return true;
}

}  // namespace

std::string Request::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return v;
  }
  return "";
}

bool Request::QueryFlag(const std::string& key) const {
  auto it = query.find(key);
  if (it == query.end()) return false;
  return it->second.empty() || it->second == "1" || it->second == "true" || it->second == "yes";
}

Response Response::Json(int status, const nlohmann::json& body) {
  Response r;
  r.status = status;
  // Replacement characters rather than an exception for invalid UTF-8 in
  // command output that reached a JSON string.
  report::AppendCompactJson(body, &r.body);
  r.body += "\n";
  return r;
}

Response Response::Error(int status, std::string code, std::string message) {
  return Json(status, {{"error", {{"code", std::move(code)}, {"message", std::move(message)}}}});
}

Response Response::NoContent() {
  Response r;
  r.status = 204;
  r.content_type.clear();
  return r;
}

bool PercentDecode(std::string_view in, std::string* out) {
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out->push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) return false;
    int hi = HexValue(in[i + 1]), lo = HexValue(in[i + 2]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return true;
}

bool ParseTarget(const std::string& target, std::string* path, std::map<std::string, std::string>* query) {
  if (target.empty() || target[0] != '/') return false;
  size_t q = target.find('?');
  *path = target.substr(0, q);
  query->clear();
  if (q == std::string::npos) return true;
  std::string_view rest(target);
  rest.remove_prefix(q + 1);
  while (!rest.empty()) {
    size_t amp = rest.find('&');
    std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    if (pair.empty()) continue;
    size_t eq = pair.find('=');
    std::string key, value;
    std::string k(pair.substr(0, eq)), v(eq == std::string_view::npos ? "" : pair.substr(eq + 1));
    std::replace(k.begin(), k.end(), '+', ' ');
    std::replace(v.begin(), v.end(), '+', ' ');
    if (!PercentDecode(k, &key) || !PercentDecode(v, &value)) return false;
    (*query)[key] = value;
  }
  return true;
}

void Router::Add(const std::string& method, const std::string& pattern, Handler handler) {
  routes_.push_back({method, Split(pattern), std::move(handler)});
}

void Router::AddPrefix(const std::string& prefix, Handler handler) {
  prefixes_.push_back({prefix, std::move(handler)});
}

void Router::Dispatch(Request request, ReplyPtr reply) const {
  for (const auto& p : prefixes_) {
    const std::string& path = request.path;
    if (path == p.prefix || (path.size() > p.prefix.size() && path.compare(0, p.prefix.size(), p.prefix) == 0 &&
                             path[p.prefix.size()] == '/')) {
      p.handler(std::move(request), std::move(reply));
      return;
    }
  }
  const std::vector<std::string> segments = Split(request.path);
  std::vector<std::string> allowed;
  for (const auto& r : routes_) {
    std::vector<std::string> params;
    if (!Match(r.segments, segments, &params)) continue;
    if (r.method == request.method) {
      request.params = std::move(params);
      r.handler(std::move(request), std::move(reply));
      return;
    }
    if (std::find(allowed.begin(), allowed.end(), r.method) == allowed.end()) allowed.push_back(r.method);
  }
  if (allowed.empty()) {
    reply->Send(Response::Error(404, "not_found", "no route for " + request.method + " " + request.path));
    return;
  }
  std::string allow;
  for (const auto& m : allowed) allow += (allow.empty() ? "" : ", ") + m;
  Response r = Response::Error(405, "method_not_allowed",
                               request.method + " is not allowed on " + request.path + " (allowed: " + allow + ")");
  r.headers.emplace_back("Allow", allow);
  reply->Send(std::move(r));
}

}  // namespace agentbox::daemon
