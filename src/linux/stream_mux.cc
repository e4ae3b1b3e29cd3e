#include "linux/stream_mux.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace agentbox::linux {
namespace {

void PutU32(std::string* s, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

bool GetU32(std::string_view s, std::size_t at, std::uint32_t* v) {
  if (s.size() < at + 4) return false;
  *v = 0;
  for (int i = 0; i < 4; ++i) *v |= static_cast<std::uint32_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return true;
}

}  // namespace

StreamMux::StreamMux(SendFrame send, Dial dial) : send_(std::move(send)), dial_(std::move(dial)) {}

bool StreamMux::Send(FrameType type, std::uint32_t id, std::string_view rest) {
  std::string payload;
  payload.reserve(4 + rest.size());
  PutU32(&payload, id);
  payload.append(rest);
  return send_(type, payload);
}

void StreamMux::Accept(UniqueFd fd, char tag) {
  if (!fd.valid()) return;
  if (conns_.size() >= kMuxMaxConnections) return;  // closed: too many at once
  const std::uint32_t id = next_id_++;
  if (!Send(FrameType::kConnOpen, id, std::string_view(&tag, 1))) return;
  Conn c;
  c.fd = std::move(fd);
  conns_.emplace(id, std::move(c));
}

bool StreamMux::Attach(std::uint32_t id, UniqueFd fd, MuxFlow flow, AttachOptions options) {
  if (!fd.valid() || conns_.count(id) || conns_.size() >= kMuxMaxConnections) return false;
  struct stat st {};
  Conn c;
  c.socket = fstat(fd.get(), &st) == 0 && S_ISSOCK(st.st_mode);
  fcntl(fd.get(), F_SETFL, fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
  c.fd = std::move(fd);
  // One way only: the other direction is over before it starts (the peer,
  // attached the other way round, neither sends its end nor expects ours).
  if (flow == MuxFlow::kOut) c.peer_end = c.shut_wr = true;
  if (flow == MuxFlow::kIn) c.read_end = true;
  c.after = options.after;
  c.write_room = options.write_cap;
  conns_.emplace(id, std::move(c));
  return true;
}

StreamMux::Conn* StreamMux::Before(const Conn& c) {
  if (!c.after) return nullptr;
  auto it = conns_.find(c.after);
  return it == conns_.end() ? nullptr : &it->second;
}

void StreamMux::Abort(std::uint32_t id, bool tell) {
  if (tell) Send(FrameType::kConnAbort, id);
  conns_.erase(id);
}

void StreamMux::MaybeFinish(std::uint32_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Conn& c = it->second;
  if (c.peer_end && c.out.empty() && !c.shut_wr) {
    if (c.socket) {
      shutdown(c.fd.get(), SHUT_WR);
    } else {
      c.fd.reset();  // a pipe's write end: its reader sees the end of file
    }
    c.shut_wr = true;
  }
  if (c.read_end && c.shut_wr) conns_.erase(it);
}

bool StreamMux::Handle(const Frame& f) {
  if (f.type != FrameType::kConnOpen && f.type != FrameType::kConnData && f.type != FrameType::kConnAck &&
      f.type != FrameType::kConnEnd && f.type != FrameType::kConnAbort) {
    return false;
  }
  std::uint32_t id = 0;
  if (!GetU32(f.payload, 0, &id)) return true;  // no id: nothing to abort
  if (f.type == FrameType::kConnOpen) {
    // Only the outside dials; an id in use, one of the attached ids, a
    // missing tag or too many connections abort the new one.
    if (!dial_ || f.payload.size() != 5 || (id & kMuxAttached) || conns_.count(id) ||
        conns_.size() >= kMuxMaxConnections) {
      Send(FrameType::kConnAbort, id);
      return true;
    }
    UniqueFd fd = dial_(f.payload[4]);
    if (!fd.valid()) {
      Send(FrameType::kConnAbort, id);
      return true;
    }
    Conn c;
    c.fd = std::move(fd);
    conns_.emplace(id, std::move(c));
    return true;
  }
  auto it = conns_.find(id);
  if (it == conns_.end()) return true;  // aborted meanwhile
  Conn& c = it->second;
  switch (f.type) {
    case FrameType::kConnData:
      // More than the window: the other end does not keep to it.
      if (c.peer_end || c.out.size() + f.payload.size() - 4 > kMuxWindow) {
        Abort(id, true);
        return true;
      }
      c.out.append(f.payload, 4);
      break;
    case FrameType::kConnAck: {
      std::uint32_t n = 0;
      if (!GetU32(f.payload, 4, &n)) {
        Abort(id, true);
        return true;
      }
      c.unacked -= std::min<std::size_t>(n, c.unacked);
      break;
    }
    case FrameType::kConnEnd:
      c.peer_end = true;
      MaybeFinish(id);
      break;
    case FrameType::kConnAbort:
      Abort(id, false);
      break;
    default:
      break;
  }
  return true;
}

void StreamMux::AppendPollFds(std::vector<pollfd>* fds) {
  polled_.clear();
  for (auto& [id, c] : conns_) {
    short events = 0;
    const Conn* before = Before(c);
    if (!c.read_end && c.unacked < kMuxWindow && !(before && !before->read_end && before->unacked >= kMuxWindow)) {
      events |= POLLIN;
    }
    if (!c.out.empty() && !(before && !before->out.empty())) events |= POLLOUT;
    polled_.push_back(id);
    // Nothing wanted of it now (its window is full, nothing to write):
    // left out of the poll, whose POLLHUP, reported whatever is asked, must
    // not end a pipe whose writer is gone while its last bytes wait for
    // the window.
    fds->push_back({events ? c.fd.get() : -1, events, 0});
  }
}

void StreamMux::ReadFrom(std::uint32_t id, Conn* c) {
  char buf[kMuxChunk];
  const std::size_t room = std::min(sizeof(buf), kMuxWindow - c->unacked);
  ssize_t n;
  do {
    n = c->socket ? recv(c->fd.get(), buf, room, MSG_DONTWAIT) : read(c->fd.get(), buf, room);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    Abort(id, true);
    return;
  }
  if (n == 0) {
    c->read_end = true;
    Send(FrameType::kConnEnd, id);
    MaybeFinish(id);
    return;
  }
  c->unacked += static_cast<std::size_t>(n);
  if (!Send(FrameType::kConnData, id, std::string_view(buf, static_cast<std::size_t>(n)))) Abort(id, false);
}

void StreamMux::WriteTo(std::uint32_t id, Conn* c) {
  if (Conn* before = Before(*c); before && !before->out.empty()) {
    WriteTo(c->after, before);
    c = nullptr;
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    c = &it->second;
    if ((before = Before(*c)) && !before->out.empty()) return;  // still behind
  }
  if (c->write_room == 0) {  // over its cap: acknowledged, dropped
    std::string count;
    PutU32(&count, static_cast<std::uint32_t>(c->out.size()));
    c->out.clear();
    Send(FrameType::kConnAck, id, count);
    MaybeFinish(id);
    return;
  }
  ssize_t n;
  const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(c->out.size(), c->write_room));
  do {
    n = c->socket ? send(c->fd.get(), c->out.data(), len, MSG_DONTWAIT | MSG_NOSIGNAL)
                  : write(c->fd.get(), c->out.data(), len);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    Abort(id, true);
    return;
  }
  c->out.erase(0, static_cast<std::size_t>(n));
  if (c->write_room != ~std::uint64_t{0}) c->write_room -= static_cast<std::uint64_t>(n);
  std::string count;
  PutU32(&count, static_cast<std::uint32_t>(n));
  Send(FrameType::kConnAck, id, count);
  MaybeFinish(id);
}

bool StreamMux::DrainBefore(std::uint32_t id) {
  for (;;) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return false;
    const std::uint32_t before_id = it->second.after;
    Conn* before = Before(it->second);
    if (!before || before->read_end) return true;
    struct pollfd p = {before->fd.get(), POLLIN, 0};
    if (poll(&p, 1, 0) <= 0 || !p.revents) return true;  // nothing waiting there
    if (before->unacked >= kMuxWindow) return false;      // behind a full window: later
    ReadFrom(before_id, before);
  }
}

void StreamMux::Service(const pollfd* fds, std::size_t n) {
  const std::vector<std::uint32_t> ids = polled_;
  for (std::size_t i = 0; i < n && i < ids.size(); ++i) {
    const short ev = fds[i].revents;
    if (!ev) continue;
    auto it = conns_.find(ids[i]);
    if (it == conns_.end()) continue;
    if (ev & POLLOUT) WriteTo(ids[i], &it->second);
    it = conns_.find(ids[i]);
    if (it == conns_.end()) continue;
    if (ev & (POLLIN | POLLHUP | POLLERR)) {
      if (!it->second.read_end && it->second.unacked < kMuxWindow) {
        // Behind another connection: what that one has to read goes first.
        if (!DrainBefore(ids[i])) continue;
        it = conns_.find(ids[i]);
        if (it == conns_.end()) continue;
        ReadFrom(ids[i], &it->second);
      } else if (it->second.read_end && (ev & (POLLERR | POLLHUP))) {
        // Closed both ways (or reset) with nothing more to read: nothing
        // can be written to it either. (Not read to its end yet: what is
        // left is read once the window has room.)
        Abort(ids[i], true);
      }
    }
  }
}

}  // namespace agentbox::linux
