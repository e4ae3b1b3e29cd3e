#include "linux/stream_mux.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <deque>
#include <random>
#include <string>

namespace agentbox::linux {
namespace {

// Two ends of a channel in one process: each end's frames are queued for
// the other, and Pump delivers them and services both ends' sockets.
struct Link {
  std::deque<Frame> to_outside, to_inside;
  std::vector<int> app_outside;  // the app ends of the sockets the outside dialled
  StreamMux inside{[this](FrameType t, std::string_view p) {
    to_outside.push_back({t, std::string(p)});
    return true;
  }};
  StreamMux outside{[this](FrameType t, std::string_view p) {
                      to_inside.push_back({t, std::string(p)});
                      return true;
                    },
                    [this](char tag) {
                      int sv[2];
                      if (tag != 'h' || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
                        return UniqueFd();
                      }
                      app_outside.push_back(sv[0]);
                      return UniqueFd(sv[1]);
                    }};
  // A connection accepted on the inside ('h'), announced and dialled:
  // the inside app's end of it (-1 on failure).
  int Connect(char tag = 'h') {
    int app[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, app) != 0) return -1;
    inside.Accept(UniqueFd(app[1]), tag);
    Pump();
    return app[0];
  }

  void Pump(int timeout_ms = 0) {
    while (!to_outside.empty()) {
      outside.Handle(to_outside.front());
      to_outside.pop_front();
    }
    while (!to_inside.empty()) {
      inside.Handle(to_inside.front());
      to_inside.pop_front();
    }
    std::vector<pollfd> fds;
    inside.AppendPollFds(&fds);
    const std::size_t split = fds.size();
    outside.AppendPollFds(&fds);
    if (fds.empty()) return;
    poll(fds.data(), fds.size(), timeout_ms);
    inside.Service(fds.data(), split);
    outside.Service(fds.data() + split, fds.size() - split);
  }
};

std::string Random(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(g());
  return s;
}

// Moves bytes between an app's socket and the strings, non-blocking.
void Shuttle(int fd, const std::string& send, std::size_t* sent, std::string* got) {
  if (*sent < send.size()) {
    ssize_t n = ::send(fd, send.data() + *sent, send.size() - *sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) *sent += static_cast<std::size_t>(n);
    if (*sent == send.size()) shutdown(fd, SHUT_WR);
  }
  char buf[65536];
  ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
  if (n > 0) got->append(buf, static_cast<std::size_t>(n));
}

TEST(StreamMux, CarriesBytesBothWaysAndHalfClosesThenForgetsTheConnection) {
  Link link;
  int app[1] = {link.Connect()};
  ASSERT_GE(app[0], 0);
  ASSERT_EQ(link.app_outside.size(), 1u);
  const int far = link.app_outside[0];
  const std::string up = Random(3 << 20, 1), down = Random(2 << 20, 2);
  std::size_t up_sent = 0, down_sent = 0;
  std::string up_got, down_got;
  for (int i = 0; i < 100000 && (up_got.size() < up.size() || down_got.size() < down.size()); ++i) {
    Shuttle(app[0], up, &up_sent, &down_got);
    Shuttle(far, down, &down_sent, &up_got);
    link.Pump(1);
  }
  EXPECT_TRUE(up_got == up) << up_got.size() << " of " << up.size();
  EXPECT_TRUE(down_got == down) << down_got.size() << " of " << down.size();
  // Both ends wrote all and shut down their writing: each sees the end of
  // file, and both muxes forget the connection.
  for (int i = 0; i < 100 && (link.inside.open() || link.outside.open()); ++i) link.Pump(1);
  char c;
  EXPECT_EQ(recv(app[0], &c, 1, MSG_DONTWAIT), 0);
  EXPECT_EQ(recv(far, &c, 1, MSG_DONTWAIT), 0);
  EXPECT_EQ(link.inside.open(), 0u);
  EXPECT_EQ(link.outside.open(), 0u);
  close(app[0]);
  close(far);
}

TEST(StreamMux, AReaderThatStopsStallsItsOwnConnectionWithinTheWindow) {
  Link link;
  int app[1] = {link.Connect()};
  ASSERT_GE(app[0], 0);
  ASSERT_EQ(link.app_outside.size(), 1u);
  const int far = link.app_outside[0];
  // The far end reads nothing, with a small receive buffer: the inside may
  // take no more than the window beyond what the sockets hold.
  const int small = 4096;
  setsockopt(far, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  const std::string up = Random(8 << 20, 3);
  std::size_t sent = 0;
  std::string ignored;
  for (int i = 0; i < 2000; ++i) {
    Shuttle(app[0], up, &sent, &ignored);
    link.Pump(0);
  }
  int unread = 0, sndbuf = 0;
  socklen_t len = sizeof(sndbuf);
  getsockopt(app[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, &len);
  ASSERT_EQ(ioctl(far, FIONREAD, &unread), 0);
  // What left the app is in its socket's buffers, the window, or the far
  // socket: a few hundred KiB, never the 8 MiB offered.
  EXPECT_LT(sent, kMuxWindow + static_cast<std::size_t>(2 * sndbuf) + static_cast<std::size_t>(unread) + (256u << 10));
  EXPECT_LT(sent, up.size());
  // Another connection still flows.
  int app2[1] = {link.Connect()};
  ASSERT_GE(app2[0], 0);
  ASSERT_EQ(link.app_outside.size(), 2u);
  ASSERT_EQ(send(app2[0], "ping", 4, 0), 4);
  std::string got;
  for (int i = 0; i < 200 && got.size() < 4; ++i) {
    link.Pump(1);
    char buf[16];
    ssize_t n = recv(link.app_outside[1], buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) got.append(buf, static_cast<std::size_t>(n));
  }
  EXPECT_EQ(got, "ping");
  for (int fd : {app[0], app2[0], link.app_outside[0], link.app_outside[1]}) close(fd);
}

TEST(StreamMux, AnUnknownTagOrADialFromTheInsideIsAborted) {
  Link link;
  int app[1] = {link.Connect('q')};  // the outside dials nothing for 'q'
  ASSERT_GE(app[0], 0);
  EXPECT_EQ(link.inside.open(), 0u);
  char c;
  EXPECT_EQ(recv(app[0], &c, 1, 0), 0);  // closed
  close(app[0]);
  // The inside dials nobody: an open frame sent to it is refused.
  std::string open = std::string("\x07\x00\x00\x00", 4) + "h";
  EXPECT_TRUE(link.inside.Handle({FrameType::kConnOpen, open}));
  ASSERT_EQ(link.to_outside.size(), 1u);
  EXPECT_EQ(link.to_outside.front().type, FrameType::kConnAbort);
  EXPECT_FALSE(link.inside.Handle({FrameType::kStdout, "x"}));
}

TEST(StreamMux, DataBeyondTheWindowAbortsTheConnection) {
  Link link;
  int app[1] = {link.Connect()};
  ASSERT_GE(app[0], 0);
  ASSERT_EQ(link.outside.open(), 1u);
  // A peer that ignores the window: more than it in one go, never acknowledged.
  const std::string id("\x01\x00\x00\x00", 4);
  link.outside.Handle({FrameType::kConnData, id + std::string(kMuxWindow, 'a')});
  EXPECT_EQ(link.outside.open(), 1u);
  link.outside.Handle({FrameType::kConnData, id + "b"});
  EXPECT_EQ(link.outside.open(), 0u);
  ASSERT_FALSE(link.to_inside.empty());
  EXPECT_EQ(link.to_inside.back().type, FrameType::kConnAbort);
  close(app[0]);
  for (int fd : link.app_outside) close(fd);
}

}  // namespace
}  // namespace agentbox::linux

namespace agentbox::linux {
namespace {

// Pipes attached on both ends under one agreed id, one way each: the bytes
// arrive whole, the end of file follows, and the ids are forgotten.
TEST(StreamMux, AttachedPipesCarryOneWayAndEndWithTheirWriter) {
  Link link;
  int in[2], out[2];
  ASSERT_EQ(pipe2(in, O_CLOEXEC), 0);   // the outside's app writes in[1]; the mux reads in[0]
  ASSERT_EQ(pipe2(out, O_CLOEXEC), 0);  // the inside's mux writes out[1]; its app reads out[0]
  const std::uint32_t id = kMuxAttached | 1;
  ASSERT_TRUE(link.outside.Attach(id, UniqueFd(in[0]), MuxFlow::kOut));
  ASSERT_TRUE(link.inside.Attach(id, UniqueFd(out[1]), MuxFlow::kIn));
  EXPECT_FALSE(link.inside.Attach(id, UniqueFd(dup(out[0])), MuxFlow::kIn)) << "an id in use was attached twice";
  const std::string data = Random(3 * kMuxWindow + 17, 7);
  fcntl(in[1], F_SETFL, O_NONBLOCK);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  std::size_t sent = 0;
  std::string got;
  bool closed = false, eof = false;
  for (int i = 0; i < 20000 && !eof; ++i) {
    if (sent < data.size()) {
      const ssize_t n = write(in[1], data.data() + sent, data.size() - sent);
      if (n > 0) sent += static_cast<std::size_t>(n);
    } else if (!closed) {
      close(in[1]);
      closed = true;
    }
    link.Pump(1);
    char buf[65536];
    const ssize_t r = read(out[0], buf, sizeof(buf));
    if (r > 0) got.append(buf, static_cast<std::size_t>(r));
    if (r == 0) eof = true;
  }
  close(out[0]);
  EXPECT_TRUE(eof) << "the reader saw no end of file after " << got.size() << " bytes";
  EXPECT_EQ(got.size(), data.size());
  EXPECT_TRUE(got == data) << "the bytes changed on the way";
  EXPECT_EQ(link.inside.open(), 0u);
  EXPECT_EQ(link.outside.open(), 0u);
}

// A writer that wrote more than the window and closed its pipe before the
// far end acknowledged anything: the pipe reports POLLHUP with bytes still
// in it, and every byte still arrives, in order, then the end of file.
TEST(StreamMux, APipeWhoseWriterClosedWhileTheWindowIsFullIsReadToItsEnd) {
  Link link;
  int in[2], out[2];
  ASSERT_EQ(pipe2(in, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(out, O_CLOEXEC), 0);
  ASSERT_GE(fcntl(in[1], F_SETPIPE_SZ, 1 << 20), static_cast<int>(4 * kMuxWindow));
  const std::uint32_t id = kMuxAttached | 2;
  ASSERT_TRUE(link.outside.Attach(id, UniqueFd(in[0]), MuxFlow::kOut));
  ASSERT_TRUE(link.inside.Attach(id, UniqueFd(out[1]), MuxFlow::kIn));
  const std::string data = Random(3 * kMuxWindow + 5, 9);
  ASSERT_EQ(write(in[1], data.data(), data.size()), static_cast<ssize_t>(data.size()));
  close(in[1]);
  // Rounds in which no acknowledgement comes back: the outside fills its
  // window and then sees the pipe's hang-up with bytes left in it.
  for (int i = 0; i < 20; ++i) {
    std::vector<pollfd> fds;
    link.outside.AppendPollFds(&fds);
    poll(fds.data(), fds.size(), 1);
    link.outside.Service(fds.data(), fds.size());
  }
  EXPECT_EQ(link.outside.open(), 1u) << "the connection was given up while its last bytes waited for the window";
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  std::string got;
  bool eof = false;
  for (int i = 0; i < 20000 && !eof; ++i) {
    link.Pump(1);
    char buf[65536];
    const ssize_t r = read(out[0], buf, sizeof(buf));
    if (r > 0) got.append(buf, static_cast<std::size_t>(r));
    if (r == 0) eof = true;
  }
  close(out[0]);
  EXPECT_TRUE(eof);
  EXPECT_EQ(got.size(), data.size());
  EXPECT_TRUE(got == data) << "the bytes changed on the way";
}

// Data for an id attached to be read only (the peer should not send any)
// aborts it: a misbehaving guest cannot write into a caller's stdin pipe.
TEST(StreamMux, DataTowardsAReadOnlyAttachmentAbortsIt) {
  Link link;
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  const std::uint32_t id = kMuxAttached | 2;
  ASSERT_TRUE(link.outside.Attach(id, UniqueFd(p[0]), MuxFlow::kOut));
  std::string payload = {char(id & 0xff), char((id >> 8) & 0xff), char((id >> 16) & 0xff), char((id >> 24) & 0xff), 'x'};
  EXPECT_TRUE(link.outside.Handle({FrameType::kConnData, payload}));
  EXPECT_EQ(link.outside.open(), 0u);
  ASSERT_FALSE(link.to_inside.empty());
  EXPECT_EQ(link.to_inside.back().type, FrameType::kConnAbort);
  close(p[1]);
}

}  // namespace
}  // namespace agentbox::linux
