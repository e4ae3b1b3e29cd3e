#include "daemon/listen.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <cstring>
#include <fstream>
#include <string>

namespace agentbox::daemon {
namespace {

class TempDirectory {
 public:
  TempDirectory() {
    std::string tmpl = std::string(getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp") + "/agentbox-listen-XXXXXX";
    path_ = mkdtemp(tmpl.data()) ? tmpl : "";
  }
  ~TempDirectory() {
    std::string cmd = "rm -rf '" + path_ + "'";
    (void)!system(cmd.c_str());
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The umask as this test started, read once (reading it means setting it).
mode_t CurrentUmask() {
  static const mode_t mask = [] {
    mode_t m = umask(022);
    umask(m);
    return m;
  }();
  return mask;
}

void Write(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
}

TEST(Listen, OnlyNumericLoopbackAddresses) {
  auto v4 = ParseLoopbackAddress("127.0.0.1:7070");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->port, 7070);
  EXPECT_TRUE(ParseLoopbackAddress("127.1.2.3:0").ok());
  auto v6 = ParseLoopbackAddress("[::1]:80");
  ASSERT_TRUE(v6.ok());
  EXPECT_TRUE(v6->v6);
  for (const char* bad : {"0.0.0.0:80", "10.0.0.1:80", "[::]:80", "[::ffff:127.0.0.1]:80", "localhost:80",
                          "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1", ":80", "[::1]80"}) {
    auto r = ParseLoopbackAddress(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().message();
    }
  }
}

TEST(Listen, BearerComparison) {
  const std::string token = "0123456789abcdef";
  EXPECT_TRUE(BearerMatches("Bearer 0123456789abcdef", token));
  EXPECT_FALSE(BearerMatches("Bearer 0123456789abcdeF", token));
  EXPECT_FALSE(BearerMatches("Bearer 0123456789abcde", token));
  EXPECT_FALSE(BearerMatches("Bearer 0123456789abcdef0", token));
  EXPECT_FALSE(BearerMatches("bearer 0123456789abcdef", token));
  EXPECT_FALSE(BearerMatches("0123456789abcdef", token));
  EXPECT_FALSE(BearerMatches("", token));
  EXPECT_FALSE(BearerMatches("Bearer ", ""));
}

TEST(Listen, TokenFileMustBePrivateAndLongEnough) {
  TempDirectory dir;
  Write(dir / "ok", "  0123456789abcdef0123\n", 0600);
  auto ok = ReadTokenFile(dir / "ok");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(*ok, "0123456789abcdef0123");

  Write(dir / "open", "0123456789abcdef0123\n", 0640);
  auto open = ReadTokenFile(dir / "open");
  ASSERT_FALSE(open.ok());
  EXPECT_NE(open.status().message().find("0640"), std::string::npos) << open.status().message();
  EXPECT_NE(open.status().message().find(dir / "open"), std::string::npos);

  Write(dir / "short", "abc\n", 0600);
  EXPECT_FALSE(ReadTokenFile(dir / "short").ok());
  Write(dir / "two", "0123456789abcdef 0123456789abcdef\n", 0600);
  EXPECT_FALSE(ReadTokenFile(dir / "two").ok());
  EXPECT_FALSE(ReadTokenFile(dir / "missing").ok());
  symlink((dir / "ok").c_str(), (dir / "link").c_str());
  EXPECT_FALSE(ReadTokenFile(dir / "link").ok()) << "a symlink is followed";
}

TEST(Listen, UnixSocketIsPrivateStaleOnesReplacedOthersRefused) {
  TempDirectory dir;
  const std::string path = dir / "d.sock";
  {
    auto fd = ListenUnix(path);
    ASSERT_TRUE(fd.ok()) << fd.status().message();
    struct stat st {};
    ASSERT_EQ(lstat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600u);
    EXPECT_TRUE(CheckSocketIsPrivate(path).ok());
    // A second daemon while the first listens.
    auto second = ListenUnix(path);
    ASSERT_FALSE(second.ok());
    EXPECT_NE(second.status().message().find("already answers"), std::string::npos);
  }
  // The listener is closed: the socket file is stale and replaced.
  auto again = ListenUnix(path);
  EXPECT_TRUE(again.ok()) << again.status().message();

  Write(dir / "file", "data", 0600);
  auto file = ListenUnix(dir / "file");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("not a socket"), std::string::npos);

  chmod(path.c_str(), 0660);
  Status loose = CheckSocketIsPrivate(path);
  EXPECT_FALSE(loose.ok());
  EXPECT_NE(loose.message().find("0660"), std::string::npos) << loose.message();

  EXPECT_FALSE(ListenUnix(dir / std::string(120, 'x')).ok());
}

// The umask belongs to the whole process: the daemon's other threads create
// files while a socket is being bound. Binding must never change it (it
// used to be 0177 for the duration of a bind).
TEST(Listen, BindingLeavesTheProcessUmaskAlone) {
  TempDirectory dir;
  std::atomic<bool> done{false};
  std::atomic<int> narrowed{0};
  const mode_t mask = CurrentUmask();  // read before any other thread runs
  std::thread creator([&] {
    int i = 0;
    while (!done) {
      const std::string file = dir / ("f" + std::to_string(i++ % 64));
      int fd = open(file.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      struct stat st {};
      if (fd >= 0 && fstat(fd, &st) == 0 && (st.st_mode & 0777) != (0644 & ~mask)) ++narrowed;
      if (fd >= 0) close(fd);
      unlink(file.c_str());
    }
  });
  for (int i = 0; i < 400 && narrowed == 0; ++i) {
    auto fd = ListenUnix(dir / "agentbox.sock");
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    unlink((dir / "agentbox.sock").c_str());
  }
  done = true;
  creator.join();
  EXPECT_EQ(narrowed, 0) << "files created while a socket was bound got a narrower mode";
}

TEST(Listen, OneLockPerStateDirectory) {
  TempDirectory dir;
  auto first = LockStateDir(dir / "state");
  ASSERT_TRUE(first.ok()) << first.status().message();
  struct stat st {};
  ASSERT_EQ(stat((dir / "state").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  auto second = LockStateDir(dir / "state");
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("another daemon"), std::string::npos);
}

}  // namespace
}  // namespace agentbox::daemon
