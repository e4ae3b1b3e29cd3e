#include "net/git_push.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace agentbox::net {
namespace {

namespace fs = std::filesystem;

// --- helpers ----------------------------------------------------------------

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/agentbox-git-push-test.XXXXXX";
    if (mkdtemp(tmpl)) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct Ran {
  int code = -1;
  std::string out;  // stdout and stderr
};

Ran Shell(const std::string& command) {
  Ran ran;
  FILE* pipe = popen(("(" + command + ") 2>&1").c_str(), "r");
  if (!pipe) return ran;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) ran.out.append(buf, n);
  int status = pclose(pipe);
  ran.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return ran;
}

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, std::string_view data,
               fs::perms perms = fs::perms::owner_read | fs::perms::owner_write) {
  std::ofstream(path, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
  fs::permissions(path, perms);
}

std::string PktLine(std::string_view payload) {
  char len[5];
  std::snprintf(len, sizeof len, "%04zx", payload.size() + 4);
  return std::string(len) + std::string(payload);
}

std::string Zeros(std::size_t n) { return std::string(n, '0'); }

std::string Digest(std::string_view data, bool sha256) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), out, &len, sha256 ? EVP_sha256() : EVP_sha1(), nullptr);
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string Hex(std::string_view raw) {
  std::string hex;
  char b[3];
  for (unsigned char c : raw) {
    std::snprintf(b, sizeof b, "%02x", c);
    hex += b;
  }
  return hex;
}

std::string Unhex(std::string_view hex) {
  std::string raw;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    raw.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  return raw;
}

std::string ObjectId(std::string_view type, std::string_view content, bool sha256 = false) {
  std::string data =
      std::string(type) + " " + std::to_string(content.size()) + std::string(1, '\0') + std::string(content);
  return Hex(Digest(data, sha256));
}

std::string Deflate(std::string_view data) {
  uLongf len = compressBound(data.size());
  std::string out(len, '\0');
  compress(reinterpret_cast<Bytef*>(out.data()), &len, reinterpret_cast<const Bytef*>(data.data()), data.size());
  out.resize(len);
  return out;
}

// A delta that inserts all of `result` (git's format, no copies).
std::string InsertDelta(std::size_t base_size, std::string_view result) {
  std::string d;
  auto varint = [&](std::uint64_t v) {
    do {
      unsigned char c = v & 0x7f;
      v >>= 7;
      d.push_back(static_cast<char>(c | (v ? 0x80 : 0)));
    } while (v);
  };
  varint(base_size);
  varint(result.size());
  for (std::size_t at = 0; at < result.size(); at += 127) {
    std::string_view chunk = result.substr(at, 127);
    d.push_back(static_cast<char>(chunk.size()));
    d.append(chunk);
  }
  return d;
}

// Packs written by hand, for what git would never produce.
class PackBuilder {
 public:
  explicit PackBuilder(bool sha256 = false) : sha256_(sha256) {}

  std::size_t Add(int type, std::string_view content) { return Object(type, content.size(), "", content); }
  std::size_t AddOfsDelta(std::size_t base_offset, std::string_view delta) {
    std::size_t offset = 12 + objects_.size();
    std::uint64_t distance = offset - base_offset;
    std::string enc(1, static_cast<char>(distance & 0x7f));
    while (distance >>= 7) {
      --distance;
      enc.insert(enc.begin(), static_cast<char>(0x80 | (distance & 0x7f)));
    }
    return Object(6, delta.size(), enc, delta);
  }
  std::size_t AddRefDelta(std::string_view base_hex, std::string_view delta) {
    return Object(7, delta.size(), Unhex(base_hex), delta);
  }
  // An object whose zlib data is given as is.
  std::size_t AddRaw(int type, std::uint64_t size, std::string_view zdata) {
    std::size_t offset = 12 + objects_.size();
    objects_ += Header(type, size);
    objects_ += zdata;
    ++count_;
    return offset;
  }
  std::string Finish(std::optional<std::uint32_t> declared = std::nullopt) const {
    std::uint32_t n = declared.value_or(count_);
    std::string pack = "PACK";
    for (std::uint32_t v : {2u, n}) {
      for (int shift = 24; shift >= 0; shift -= 8) pack.push_back(static_cast<char>((v >> shift) & 0xff));
    }
    pack += objects_;
    return pack + Digest(pack, sha256_);
  }

 private:
  static std::string Header(int type, std::uint64_t size) {
    std::string h;
    unsigned char c = static_cast<unsigned char>((type << 4) | (size & 15));
    size >>= 4;
    while (size) {
      h.push_back(static_cast<char>(c | 0x80));
      c = size & 0x7f;
      size >>= 7;
    }
    h.push_back(static_cast<char>(c));
    return h;
  }
  std::size_t Object(int type, std::uint64_t size, std::string_view between, std::string_view content) {
    std::size_t offset = 12 + objects_.size();
    objects_ += Header(type, size);
    objects_ += between;
    objects_ += Deflate(content);
    ++count_;
    return offset;
  }

  bool sha256_;
  std::string objects_;
  std::uint32_t count_ = 0;
};

std::string CommitText(const std::string& tree, const std::vector<std::string>& parents, const std::string& msg) {
  std::string c = "tree " + tree + "\n";
  for (const std::string& p : parents) c += "parent " + p + "\n";
  return c + "author a <a@example.com> 1700000000 +0000\ncommitter a <a@example.com> 1700000000 +0000\n\n" + msg + "\n";
}

// A receive-pack body around `pack`.
std::string Body(const std::vector<RefUpdate>& updates, std::string_view caps, std::string_view pack) {
  std::string body;
  for (std::size_t i = 0; i < updates.size(); ++i) {
    std::string line = updates[i].old_oid + " " + updates[i].new_oid + " " + updates[i].ref;
    if (i == 0) line += std::string(1, '\0') + std::string(caps);
    body += PktLine(line);
  }
  return body + "0000" + std::string(pack);
}

// Text from a fixed seed: commit messages that differ where the test wants.
std::vector<std::string> Blocks(std::size_t n, std::size_t size) {
  std::mt19937 rng(42);
  std::vector<std::string> blocks(n);
  for (std::string& b : blocks) {
    for (std::size_t i = 0; i < size; ++i) b.push_back(static_cast<char>('a' + rng() % 26));
  }
  return blocks;
}

// --- a local remote and a working repository, with the real git ------------

class GitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Shell("git --version").code != 0) GTEST_SKIP() << "not applicable here: git is not installed";
    ASSERT_FALSE(dir_.path().empty());
    env_ = "unset GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE GIT_OBJECT_DIRECTORY; export HOME=" + Quote(dir_.path()) +
           " GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_TERMINAL_PROMPT=0"
           " GIT_AUTHOR_NAME=agentbox GIT_AUTHOR_EMAIL=agentbox@example.com GIT_COMMITTER_NAME=agentbox"
           " GIT_COMMITTER_EMAIL=agentbox@example.com GIT_AUTHOR_DATE='1700000000 +0000'"
           " GIT_COMMITTER_DATE='1700000000 +0000'; ";
  }

  std::string Path(const std::string& rel) const { return dir_.path() + "/" + rel; }

  // Runs `command` in the temp dir (or `sub` of it); a failure fails the test.
  std::string Sh(const std::string& command, const std::string& sub = ".") {
    Ran ran = Shell(env_ + "cd " + Quote(Path(sub)) + " && " + command);
    EXPECT_EQ(ran.code, 0) << command << "\n" << ran.out;
    return ran.out;
  }
  Ran TrySh(const std::string& command, const std::string& sub = ".") {
    return Shell(env_ + "cd " + Quote(Path(sub)) + " && " + command);
  }

  // remote.git (bare) and work, with one commit pushed as main. False when
  // this git cannot make repositories of `format`.
  bool InitRepos(const std::string& format = "sha1") {
    std::string init = "git -c init.defaultBranch=main init -q --object-format=" + format;
    if (TrySh(init + " --bare remote.git").code != 0) return false;
    Sh(init + " work");
    Commit("base");
    Sh("git push -q " + Quote(Path("remote.git")) + " HEAD:refs/heads/main", "work");
    return true;
  }
  std::string Commit(const std::string& message) {
    WriteFile(Path("msg"), message);
    Sh("git commit -q --allow-empty -F " + Quote(Path("msg")), "work");
    return Head();
  }
  std::string Head(const std::string& rev = "HEAD", const std::string& repo = "work") {
    std::string out = Sh("git rev-parse " + rev, repo);
    return out.substr(0, out.find('\n'));
  }

  // The body git sends for `git push ARGS` to remote.git: a receive-pack
  // wrapper copies its input to a file on the way to the real receive-pack.
  std::string CapturePush(const std::string& args) {
    WriteFile(Path("tee.sh"), "#!/bin/sh\ntee \"$AGENTBOX_DUMP\" | git receive-pack \"$@\"\n", fs::perms::owner_all);
    std::remove(Path("dump").c_str());
    Sh("AGENTBOX_DUMP=" + Quote(Path("dump")) +
           " timeout 60 git -c remote.x.url=" + Quote("file://" + Path("remote.git")) +
           " -c remote.x.receivepack=" + Quote(Path("tee.sh")) + " push -q x " + args,
       "work");
    return ReadFile(Path("dump"));
  }

  // `git push ARGS` to a fake receive-pack that sends `advertisement`, keeps
  // the request and answers `response`. Returns git's output.
  Ran PushToFake(const std::string& args, const std::string& advertisement, const std::string& response) {
    WriteFile(Path("fake/advertisement"), advertisement);
    WriteFile(Path("fake/response"), response);
    // The client closes its side once the pack is written: the request ends
    // at end of input (these pushes always carry a pack).
    WriteFile(Path("fake/receive-pack"),
              "#!/bin/sh\nd=" + Quote(Path("fake")) +
                  "\ncat \"$d/advertisement\"\ncat > \"$d/request\"\ncat \"$d/response\"\n",
              fs::perms::owner_all);
    return TrySh("timeout 60 git -c remote.y.url=" + Quote("file://" + Path("remote.git")) +
                     " -c remote.y.receivepack=" + Quote(Path("fake/receive-pack")) + " push y " + args,
                 "work");
  }

  void SetUpFake() { fs::create_directories(Path("fake")); }

  TempDir dir_;
  std::string env_;
};

ReceivePackRequest MustParse(std::string_view body) {
  Result<ReceivePackRequest> parsed = ParseReceivePack(body);
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  return parsed.ok() ? *parsed : ReceivePackRequest{};
}

UpdateKind KindOf(const ReceivePackRequest& request, std::size_t i = 0) {
  Result<PackIndex> index = PackIndex::Build(request.pack, request.oid_hex_len);
  EXPECT_TRUE(index.ok()) << index.status().ToString();
  if (!index.ok() || i >= request.updates.size()) return UpdateKind::kNotProvenFastForward;
  return Classify(request.updates[i], *index);
}

std::string ErrorOf(std::string_view body) {
  Result<ReceivePackRequest> parsed = ParseReceivePack(body);
  return parsed.ok() ? "(parsed)" : parsed.status().ToString();
}

std::string PackErrorOf(std::string_view pack, const PackLimits& limits = {}, std::size_t hex = 40) {
  Result<PackIndex> index = PackIndex::Build(pack, hex, limits);
  return index.ok() ? "(built)" : index.status().ToString();
}

// --- ClassifyGitRequest -------------------------------------------------------

TEST(ClassifyGitRequest, SmartHttpEndpoints) {
  GitRequest r = ClassifyGitRequest("GET", "/acme/app.git/info/refs", "service=git-upload-pack");
  EXPECT_EQ(r.service, GitService::kUploadPack);
  EXPECT_TRUE(r.advertisement);
  EXPECT_EQ(r.repo_path, "/acme/app.git");

  r = ClassifyGitRequest("GET", "/acme/app.git/info/refs", "service=git-receive-pack");
  EXPECT_EQ(r.service, GitService::kReceivePack);
  EXPECT_TRUE(r.advertisement);

  r = ClassifyGitRequest("POST", "/acme/app.git/git-receive-pack", "");
  EXPECT_EQ(r.service, GitService::kReceivePack);
  EXPECT_FALSE(r.advertisement);
  EXPECT_EQ(r.repo_path, "/acme/app.git");

  r = ClassifyGitRequest("POST", "/acme/app/git-upload-pack", "");
  EXPECT_EQ(r.service, GitService::kUploadPack);
  EXPECT_EQ(r.repo_path, "/acme/app");

  r = ClassifyGitRequest("GET", "/a/b/info/refs", "x=1&service=git%2Dreceive-pack");
  EXPECT_EQ(r.service, GitService::kReceivePack);
  EXPECT_EQ(r.repo_path, "/a/b");
}

TEST(ClassifyGitRequest, NoSpellingOfAPushEscapes) {
  EXPECT_EQ(ClassifyGitRequest("POST", "/acme/app.git/GIT-Receive-Pack/", "").service, GitService::kReceivePack);
  EXPECT_EQ(ClassifyGitRequest("post", "/acme/app.git/git-receive-pack", "").service, GitService::kReceivePack);
  EXPECT_EQ(ClassifyGitRequest("POST", "/acme/app.git/git-receive-pack", "service=git-upload-pack").service,
            GitService::kReceivePack);
  GitRequest root = ClassifyGitRequest("POST", "/git-receive-pack", "");
  EXPECT_EQ(root.service, GitService::kReceivePack);
  EXPECT_EQ(root.repo_path, "");
}

TEST(ClassifyGitRequest, OtherRequestsAreNotSmartGit) {
  EXPECT_EQ(ClassifyGitRequest("GET", "/acme/app.git/info/refs", "").service, GitService::kNone);  // dumb
  EXPECT_EQ(
      ClassifyGitRequest("GET", "/acme/app.git/info/refs", "service=git-upload-pack&service=git-receive-pack").service,
      GitService::kNone);
  EXPECT_EQ(ClassifyGitRequest("GET", "/acme/app.git/info/refs", "service=git-upload-archive").service,
            GitService::kNone);
  EXPECT_EQ(ClassifyGitRequest("GET", "/acme/app.git/info/refs", "service=%zz").service, GitService::kNone);
  EXPECT_EQ(ClassifyGitRequest("GET", "/acme/app.git/git-receive-pack", "").service, GitService::kNone);
  EXPECT_EQ(ClassifyGitRequest("POST", "/acme/app.git/info/refs", "service=git-receive-pack").service,
            GitService::kNone);
  EXPECT_EQ(ClassifyGitRequest("GET", "/acme/app.git/objects/info/packs", "").service, GitService::kNone);
  EXPECT_EQ(ClassifyGitRequest("POST", "/acme/app.git/xgit-receive-pack", "").service, GitService::kNone);
  EXPECT_EQ(ClassifyGitRequest("GET", "/", "").service, GitService::kNone);
}

// --- RemoteMatches ------------------------------------------------------------

TEST(RemoteMatches, OneSegmentStarAndOptionalDotGit) {
  std::vector<std::string> remotes{"https://github.com/acme/*"};
  EXPECT_TRUE(RemoteMatches(remotes, "github.com", 443, "/acme/app.git"));
  EXPECT_TRUE(RemoteMatches(remotes, "github.com", 443, "/acme/app"));
  EXPECT_TRUE(RemoteMatches(remotes, "github.com", 443, "/acme/app.git/"));
  EXPECT_FALSE(RemoteMatches(remotes, "github.com", 443, "/acme/team/app.git"));
  EXPECT_FALSE(RemoteMatches(remotes, "github.com", 443, "/acmex/app.git"));
  EXPECT_FALSE(RemoteMatches(remotes, "github.com", 443, "/other/app.git"));
  EXPECT_FALSE(RemoteMatches(remotes, "gitlab.com", 443, "/acme/app.git"));
  EXPECT_FALSE(RemoteMatches(remotes, "api.github.com", 443, "/acme/app.git"));
  EXPECT_FALSE(RemoteMatches(remotes, "github.com", 8443, "/acme/app.git"));
  EXPECT_FALSE(RemoteMatches({}, "github.com", 443, "/acme/app.git"));

  EXPECT_TRUE(RemoteMatches({"https://github.com/acme/app.git"}, "github.com", 443, "/acme/app"));
  EXPECT_TRUE(RemoteMatches({"https://github.com/acme/app"}, "github.com", 443, "/acme/app.git"));
  EXPECT_FALSE(RemoteMatches({"https://github.com/acme/app"}, "github.com", 443, "/acme/app2.git"));
  EXPECT_TRUE(RemoteMatches({"https://github.com/acme/app-*"}, "github.com", 443, "/acme/app-web.git"));
}

TEST(RemoteMatches, DoubleStarHostsAndPorts) {
  EXPECT_TRUE(RemoteMatches({"https://github.com/acme/**"}, "github.com", 443, "/acme/group/sub/app.git"));
  EXPECT_FALSE(RemoteMatches({"https://github.com/acme/**"}, "github.com", 443, "/other/app.git"));
  EXPECT_TRUE(RemoteMatches({"https://GitHub.COM:443/acme/*"}, "github.com", 443, "/acme/app.git"));
  EXPECT_TRUE(RemoteMatches({"https://git.example.com:8443/x/*"}, "git.example.com", 8443, "/x/y.git"));
  EXPECT_FALSE(RemoteMatches({"https://git.example.com:8443/x/*"}, "git.example.com", 443, "/x/y.git"));
  EXPECT_TRUE(RemoteMatches({"https://gitlab.com/a/*", "https://github.com/acme/*"}, "github.com", 443, "/acme/b"));
}

TEST(RemoteMatches, OnlyPlainHttpsUrlsMatch) {
  EXPECT_FALSE(RemoteMatches({"http://github.com/acme/*"}, "github.com", 443, "/acme/app.git"));
  EXPECT_FALSE(RemoteMatches({"ssh://github.com/acme/*"}, "github.com", 443, "/acme/app.git"));
  EXPECT_FALSE(RemoteMatches({"https://user@github.com/acme/*"}, "github.com", 443, "/acme/app.git"));
  EXPECT_FALSE(RemoteMatches({"https://github.com/acme/*?x=1"}, "github.com", 443, "/acme/app.git"));
  EXPECT_FALSE(RemoteMatches({"github.com/acme/*"}, "github.com", 443, "/acme/app.git"));
  EXPECT_FALSE(RemoteMatches({"https:///acme/*"}, "", 443, "/acme/app.git"));
}

// --- ref globs ----------------------------------------------------------------

TEST(SegmentGlobMatch, RefGlobs) {
  EXPECT_TRUE(SegmentGlobMatch("refs/heads/agent/*", "refs/heads/agent/x"));
  EXPECT_FALSE(SegmentGlobMatch("refs/heads/agent/*", "refs/heads/agent/x/y"));
  EXPECT_FALSE(SegmentGlobMatch("refs/heads/agent/*", "refs/heads/agent"));
  EXPECT_FALSE(SegmentGlobMatch("refs/heads/agent/*", "refs/heads/main"));
  EXPECT_TRUE(SegmentGlobMatch("refs/heads/agent/**", "refs/heads/agent/x/y"));
  EXPECT_TRUE(SegmentGlobMatch("refs/heads/agent-*", "refs/heads/agent-1"));
  EXPECT_FALSE(SegmentGlobMatch("refs/heads/agent-*", "refs/heads/agent-1/x"));
  EXPECT_FALSE(SegmentGlobMatch("refs/heads/agent-*", "refs/heads/agent"));
  EXPECT_TRUE(SegmentGlobMatch("refs/**/main", "refs/heads/main"));
  EXPECT_TRUE(SegmentGlobMatch("refs/**/main", "refs/main"));
  EXPECT_TRUE(SegmentGlobMatch("refs/**/main", "refs/remotes/origin/main"));
  EXPECT_FALSE(SegmentGlobMatch("refs/**/main", "refs/heads/mainline"));
  EXPECT_TRUE(SegmentGlobMatch("refs/heads/main", "refs/heads/main"));
  EXPECT_FALSE(SegmentGlobMatch("refs/heads/main", "refs/heads/main2"));
  EXPECT_FALSE(SegmentGlobMatch("*", "refs/heads/main"));
  EXPECT_TRUE(SegmentGlobMatch("**", "refs/heads/main"));
  EXPECT_TRUE(SegmentGlobMatch("refs/*/*", "refs/tags/v1"));
  EXPECT_TRUE(SegmentGlobMatch("refs/heads/*x*y", "refs/heads/axbxy"));
}

TEST(SegmentGlobMatch, PathologicalPatternsStayFast) {
  std::string name = "refs/heads/" + std::string(20000, 'a');
  EXPECT_FALSE(SegmentGlobMatch("refs/heads/*a*a*a*a*a*a*a*a*b", name));
  std::string deep = "refs";
  for (int i = 0; i < 2000; ++i) deep += "/a";
  EXPECT_FALSE(SegmentGlobMatch("refs/**/**/**/**/**/b", deep));
}

// --- ParseReceivePack on hand-made bodies -------------------------------------

const std::string kOld = std::string(40, '1');
const std::string kNew = std::string(40, '2');

TEST(ParseReceivePack, CommandsCapabilitiesAndPack) {
  std::string body = PktLine(kOld + " " + kNew + " refs/heads/main" + std::string(1, '\0') +
                             " report-status side-band-64k agent=x\n") +
                     PktLine(Zeros(40) + " " + kNew + " refs/heads/agent/new\n") +
                     PktLine(kOld + " " + Zeros(40) + " refs/tags/v1") + "0000PACKrest";
  ReceivePackRequest r = MustParse(body);
  ASSERT_EQ(r.updates.size(), 3u);
  EXPECT_EQ(r.updates[0], (RefUpdate{kOld, kNew, "refs/heads/main"}));
  EXPECT_EQ(r.updates[1], (RefUpdate{Zeros(40), kNew, "refs/heads/agent/new"}));
  EXPECT_EQ(r.updates[2], (RefUpdate{kOld, Zeros(40), "refs/tags/v1"}));
  EXPECT_EQ(r.capabilities, (std::vector<std::string>{"report-status", "side-band-64k", "agent=x"}));
  EXPECT_TRUE(r.HasCapability("side-band-64k"));
  EXPECT_FALSE(r.HasCapability("side-band"));
  EXPECT_EQ(r.oid_hex_len, 40u);
  EXPECT_EQ(r.pack, "PACKrest");
  EXPECT_FALSE(r.push_options);
}

TEST(ParseReceivePack, ProbeShallowAndPushOptions) {
  ReceivePackRequest probe = MustParse("0000");
  EXPECT_TRUE(probe.updates.empty());

  std::string shallow = PktLine("shallow " + std::string(40, '3')) +
                        PktLine(kOld + " " + kNew + " refs/heads/main" + std::string(1, '\0') + "report-status") +
                        "0000PACK";
  EXPECT_EQ(MustParse(shallow).updates.size(), 1u);

  std::string options =
      PktLine(kOld + " " + kNew + " refs/heads/main" + std::string(1, '\0') + "report-status push-options") + "0000" +
      PktLine("ci.skip") + PktLine("x=y") + "0000PACK";
  ReceivePackRequest r = MustParse(options);
  EXPECT_TRUE(r.push_options);
  EXPECT_EQ(r.pack, "PACK");

  std::string sha256 = PktLine(std::string(64, 'a') + " " + std::string(64, 'b') + " refs/heads/main" +
                               std::string(1, '\0') + "report-status object-format=sha256") +
                       "0000";
  EXPECT_EQ(MustParse(sha256).oid_hex_len, 64u);
}

TEST(ParseReceivePack, MalformedBodiesAreRefusedWithTheReason) {
  const std::string caps = std::string(1, '\0') + "report-status";
  const std::string good = PktLine(kOld + " " + kNew + " refs/heads/main" + caps) + "0000";
  EXPECT_NE(ErrorOf("").find("empty"), std::string::npos);
  EXPECT_NE(ErrorOf(good.substr(0, 30)).find("truncated pkt-line"), std::string::npos) << ErrorOf(good.substr(0, 30));
  EXPECT_NE(ErrorOf(good.substr(0, 2)).find("truncated pkt-line"), std::string::npos);
  EXPECT_NE(ErrorOf(good.substr(0, good.size() - 4)).find("truncated pkt-line"), std::string::npos);  // no flush
  EXPECT_NE(ErrorOf("zz12" + good).find("not hex"), std::string::npos);
  EXPECT_NE(ErrorOf("0001" + good).find("delimiter"), std::string::npos);
  EXPECT_NE(ErrorOf("0004" + good).find("empty pkt-line"), std::string::npos);
  EXPECT_NE(ErrorOf("fff1" + std::string(70000, 'x')).find("over 65520"), std::string::npos);
  EXPECT_NE(
      ErrorOf(PktLine(kOld.substr(1) + " " + kNew + " refs/heads/main" + caps) + "0000").find("malformed command"),
      std::string::npos);
  EXPECT_NE(ErrorOf(PktLine(std::string(64, '1') + " " + std::string(64, '2') + " refs/heads/main" + caps) + "0000")
                .find("malformed command"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf(PktLine(kOld + " " + kNew + " refs/heads/main" + std::string(1, '\0') + "object-format=sha256") + "0000")
          .find("malformed command"),
      std::string::npos);
  EXPECT_NE(
      ErrorOf(PktLine(kOld + " " + kNew + " refs/heads/main" + std::string(1, '\0') + "object-format=md5") + "0000")
          .find("object-format"),
      std::string::npos);
  EXPECT_NE(ErrorOf(PktLine(std::string(40, 'A') + " " + kNew + " refs/heads/main" + caps) + "0000").find("lower-case"),
            std::string::npos);
  EXPECT_NE(ErrorOf(PktLine(kOld + " " + kNew + " refs/heads/a b" + caps) + "0000").find("malformed command"),
            std::string::npos);
  for (std::string bad : {"HEAD", "refs/heads/../main", "refs/heads/x.lock", "refs/heads/.x", "refs/heads//x",
                          "refs/heads/x/", "refs/heads/a@{1}", "refs/heads/a~1", "refs/heads/a:b", "refs/heads/a*"}) {
    EXPECT_NE(ErrorOf(PktLine(kOld + " " + kNew + " " + bad + caps) + "0000").find("ref name"), std::string::npos)
        << bad;
  }
  EXPECT_NE(ErrorOf(good.substr(0, good.size() - 4) + PktLine(kOld + " " + kNew + " refs/heads/main") + "0000")
                .find("two commands"),
            std::string::npos);
  EXPECT_NE(ErrorOf(good.substr(0, good.size() - 4) + PktLine(kOld + " " + kNew + " refs/heads/x" + caps) + "0000")
                .find("capabilities on a command other than the first"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf(PktLine("push-cert" + caps + " push-cert=x\n") + PktLine("certificate version 0.1\n")).find("push-cert"),
      std::string::npos);
  EXPECT_NE(ErrorOf(PktLine("shallow 123") + good).find("shallow"), std::string::npos);
  EXPECT_NE(ErrorOf("0000PACK").find("after an empty command list"), std::string::npos);
  EXPECT_NE(ErrorOf(PktLine(kOld + " " + kNew + " refs/heads/main" + caps + " push-options") + "0000" + PktLine("opt"))
                .find("push options"),
            std::string::npos);
}

// --- PackIndex on packs made by hand --------------------------------------------

struct HandCommits {
  std::string tree = std::string(40, 'e');
  std::string old_oid = std::string(40, 'f');  // the server's commit, not in the pack
};

TEST(PackIndex, WalksParentsThroughMergesAndStopsAtThePackEdge) {
  HandCommits h;
  std::string other = std::string(40, 'c');  // another commit outside the pack
  std::string c1 = CommitText(h.tree, {h.old_oid}, "one");
  std::string c2 = CommitText(h.tree, {other, ObjectId("commit", c1)}, "merge");
  std::string lone = CommitText(h.tree, {other}, "elsewhere");
  PackBuilder pb;
  pb.Add(1, c2);
  pb.Add(1, c1);
  pb.Add(1, lone);
  pb.Add(3, "a blob");
  Result<PackIndex> index = PackIndex::Build(pb.Finish(), 40);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->commit_count(), 3u);
  EXPECT_EQ(index->object_count(), 4u);
  ASSERT_NE(index->Parents(ObjectId("commit", c2)), nullptr);
  EXPECT_EQ(*index->Parents(ObjectId("commit", c2)), (std::vector<std::string>{other, ObjectId("commit", c1)}));
  EXPECT_EQ(Classify({h.old_oid, ObjectId("commit", c2), "refs/heads/main"}, *index), UpdateKind::kFastForward);
  EXPECT_EQ(Classify({h.old_oid, ObjectId("commit", lone), "refs/heads/main"}, *index),
            UpdateKind::kNotProvenFastForward);
  EXPECT_EQ(Classify({h.old_oid, std::string(40, '9'), "refs/heads/main"}, *index), UpdateKind::kNotProvenFastForward);
  EXPECT_EQ(Classify({h.old_oid, h.old_oid, "refs/heads/main"}, *index), UpdateKind::kFastForward);
  EXPECT_EQ(Classify({Zeros(40), h.old_oid, "refs/heads/main"}, *index), UpdateKind::kCreate);
  EXPECT_EQ(Classify({h.old_oid, Zeros(40), "refs/heads/main"}, *index), UpdateKind::kDelete);
}

TEST(PackIndex, OnlyParentLinesRightAfterTheTreeAreParents) {
  HandCommits h;
  std::string late = "tree " + h.tree + "\nauthor a <a@example.com> 1 +0000\nparent " + h.old_oid + "\n\nmsg\n";
  std::string no_tree = "parent " + h.old_oid + "\ntree " + h.tree + "\n\nmsg\n";
  std::string upper = CommitText(h.tree, {std::string(40, 'F')}, "upper-case parent");
  PackBuilder pb;
  pb.Add(1, late);
  pb.Add(1, no_tree);
  pb.Add(1, upper);
  Result<PackIndex> index = PackIndex::Build(pb.Finish(), 40);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(Classify({h.old_oid, ObjectId("commit", late), "refs/heads/x"}, *index), UpdateKind::kNotProvenFastForward);
  EXPECT_EQ(Classify({h.old_oid, ObjectId("commit", no_tree), "refs/heads/x"}, *index),
            UpdateKind::kNotProvenFastForward);
  // git reads hex in either case; the name is the same commit.
  EXPECT_EQ(Classify({h.old_oid, ObjectId("commit", upper), "refs/heads/x"}, *index), UpdateKind::kFastForward);
}

TEST(PackIndex, ResolvesDeepOfsChainsAndRefDeltasInEitherOrder) {
  HandCommits h;
  std::vector<std::string> commits;
  std::string parent = h.old_oid;
  for (int i = 0; i < 12; ++i) {
    commits.push_back(CommitText(h.tree, {parent}, "commit " + std::to_string(i)));
    parent = ObjectId("commit", commits.back());
  }
  PackBuilder pb;
  // A REF_DELTA on commit 11 placed before it, then a chain of OFS_DELTAs.
  std::string tip = CommitText(h.tree, {ObjectId("commit", commits[11])}, "tip");
  pb.AddRefDelta(ObjectId("commit", commits[11]), InsertDelta(commits[11].size(), tip));
  std::size_t base = pb.Add(1, commits[0]);
  for (int i = 1; i < 12; ++i) base = pb.AddOfsDelta(base, InsertDelta(commits[i - 1].size(), commits[i]));
  // A REF_DELTA on a base outside the pack (a thin pack).
  pb.AddRefDelta(std::string(40, 'd'), InsertDelta(10, CommitText(h.tree, {}, "thin")));
  std::string pack = pb.Finish();

  Result<PackIndex> index = PackIndex::Build(pack, 40);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->commit_count(), 13u);
  EXPECT_EQ(index->resolved_deltas(), 12u);
  EXPECT_EQ(index->unresolved_deltas(), 1u);
  EXPECT_EQ(Classify({h.old_oid, ObjectId("commit", tip), "refs/heads/x"}, *index), UpdateKind::kFastForward);
  EXPECT_EQ(Classify({h.old_oid, ObjectId("commit", CommitText(h.tree, {}, "thin")), "refs/heads/x"}, *index),
            UpdateKind::kNotProvenFastForward);

  PackLimits shallow;
  shallow.max_delta_depth = 5;
  EXPECT_NE(PackErrorOf(pack, shallow).find("max_delta_depth"), std::string::npos) << PackErrorOf(pack, shallow);
}

TEST(PackIndex, MalformedPacksAreRefusedWithTheReason) {
  PackBuilder one;
  one.Add(1, CommitText(std::string(40, 'e'), {}, "x"));
  std::string pack = one.Finish();

  EXPECT_NE(PackErrorOf("").find("shorter than"), std::string::npos);
  EXPECT_NE(PackErrorOf("JUNK" + pack.substr(4)).find("signature"), std::string::npos);
  std::string v9 = pack;
  v9[7] = 9;
  EXPECT_NE(PackErrorOf(v9).find("version 9"), std::string::npos);
  std::string bad_sum = pack;
  bad_sum.back() ^= 1;
  EXPECT_NE(PackErrorOf(bad_sum).find("checksum mismatch"), std::string::npos);
  EXPECT_NE(PackErrorOf(pack.substr(0, pack.size() - 25)).find("pack:"), std::string::npos);
  EXPECT_NE(PackErrorOf(pack, {}, 41).find("40 or 64"), std::string::npos);

  // Object count bombs: a count over the bound, and a count the data cannot hold.
  EXPECT_NE(PackErrorOf(PackBuilder().Finish(0xffffffffu)).find("max_objects"), std::string::npos);
  EXPECT_NE(PackErrorOf(one.Finish(1000)).find("more objects than it has bytes for"), std::string::npos);
  EXPECT_NE(PackErrorOf(one.Finish(2)).find("truncated before object 1"), std::string::npos)
      << PackErrorOf(one.Finish(2));

  // A bad zlib stream, a stream longer or shorter than declared.
  PackBuilder zbad;
  zbad.AddRaw(3, 5, "\x78\x9c\xff\xff\xff\xff\xff\xff");
  EXPECT_NE(PackErrorOf(zbad.Finish()).find("bad zlib stream"), std::string::npos) << PackErrorOf(zbad.Finish());
  PackBuilder longer;
  longer.AddRaw(3, 3, Deflate("more than three"));
  EXPECT_NE(PackErrorOf(longer.Finish()).find("inflates past its declared size"), std::string::npos);
  PackBuilder shorter;
  shorter.AddRaw(3, 30, Deflate("short"));
  EXPECT_NE(PackErrorOf(shorter.Finish()).find("not the declared 30"), std::string::npos);

  // An inflate bomb: 64 MiB of zeros in a few tens of kilobytes.
  PackBuilder bomb;
  bomb.Add(3, std::string(64 << 20, '\0'));
  PackLimits small;
  small.max_inflated_bytes = 1 << 20;
  EXPECT_NE(PackErrorOf(bomb.Finish(), small).find("max_inflated_bytes"), std::string::npos);

  PackLimits tiny_commits;
  tiny_commits.max_commit_bytes = 16;
  EXPECT_NE(PackErrorOf(pack, tiny_commits).find("max_commit_bytes"), std::string::npos);

  PackBuilder type5;
  type5.Add(5, "x");
  EXPECT_NE(PackErrorOf(type5.Finish()).find("invalid object type 5"), std::string::npos);

  PackBuilder bad_base;
  std::size_t at = bad_base.Add(3, "blob");
  bad_base.AddOfsDelta(at + 1, InsertDelta(4, "x"));
  EXPECT_NE(PackErrorOf(bad_base.Finish()).find("starts no object"), std::string::npos);

  // A commit delta that copies outside its base.
  std::string c = CommitText(std::string(40, 'e'), {}, "base");
  PackBuilder outside;
  std::size_t base = outside.Add(1, c);
  std::string delta = InsertDelta(c.size(), "");
  delta.back() = 10;                        // result size 10 …
  delta += std::string("\x91\xf0\x0a", 3);  // … copied from offset 0xf0, beyond the base
  outside.AddOfsDelta(base, delta);
  EXPECT_NE(PackErrorOf(outside.Finish()).find("copy outside its base"), std::string::npos)
      << PackErrorOf(outside.Finish());
}

// --- what git really sends -------------------------------------------------------

TEST_F(GitTest, FastForwardOfSeveralCommits) {
  ASSERT_TRUE(InitRepos());
  std::string old_tip = Head();
  Commit("two");
  Commit("three");
  std::string tip = Commit("four");
  const std::string r_body = CapturePush("HEAD:refs/heads/main");
  ReceivePackRequest r = MustParse(r_body);
  ASSERT_EQ(r.updates.size(), 1u);
  EXPECT_EQ(r.updates[0], (RefUpdate{old_tip, tip, "refs/heads/main"}));
  EXPECT_TRUE(r.HasCapability("side-band-64k"));
  EXPECT_TRUE(r.HasCapability("report-status") || r.HasCapability("report-status-v2"));
  Result<PackIndex> index = PackIndex::Build(r.pack, 40);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->commit_count(), 3u);
  EXPECT_EQ(Classify(r.updates[0], *index), UpdateKind::kFastForward);
  EXPECT_TRUE(CheckPush({{"refs/heads/main"}, true}, r).allowed());
}

TEST_F(GitTest, ForcedUpdateAfterAmend) {
  ASSERT_TRUE(InitRepos());
  Commit("two");
  Sh("git push -q " + Quote(Path("remote.git")) + " HEAD:refs/heads/main", "work");
  WriteFile(Path("msg"), "two, amended");
  Sh("git commit -q --amend --allow-empty -F " + Quote(Path("msg")), "work");
  const std::string r_body = CapturePush("--force HEAD:refs/heads/main");
  ReceivePackRequest r = MustParse(r_body);
  ASSERT_EQ(r.updates.size(), 1u);
  EXPECT_EQ(KindOf(r), UpdateKind::kNotProvenFastForward);
  PushVerdict verdict = CheckPush({{}, true}, r);
  ASSERT_EQ(verdict.refused.size(), 1u);
  EXPECT_EQ(verdict.refused[0].reason, "forced update of refs/heads/main refused by policy");
  EXPECT_TRUE(CheckPush({{}, false}, r).allowed());
}

TEST_F(GitTest, CreateAndDelete) {
  ASSERT_TRUE(InitRepos());
  Commit("on a branch");
  const std::string create_body = CapturePush("HEAD:refs/heads/agent/new");
  ReceivePackRequest create = MustParse(create_body);
  ASSERT_EQ(create.updates.size(), 1u);
  EXPECT_EQ(create.updates[0].old_oid, Zeros(40));
  EXPECT_EQ(KindOf(create), UpdateKind::kCreate);
  EXPECT_TRUE(CheckPush({{"refs/heads/agent/*"}, true}, create).allowed());

  const std::string del_body = CapturePush(":refs/heads/agent/new");
  ReceivePackRequest del = MustParse(del_body);
  ASSERT_EQ(del.updates.size(), 1u);
  EXPECT_EQ(del.updates[0].new_oid, Zeros(40));
  EXPECT_TRUE(del.pack.empty());  // deletions only: no pack
  Result<PackIndex> empty = PackIndex::Build(del.pack, 40);
  EXPECT_FALSE(empty.ok());
  EXPECT_EQ(Classify(del.updates[0], PackIndex()), UpdateKind::kDelete);
  PushVerdict verdict = CheckPush({{"refs/heads/agent/*"}, true}, del);
  ASSERT_EQ(verdict.refused.size(), 1u);
  EXPECT_EQ(verdict.refused[0].reason, "deletion of refs/heads/agent/new refused by policy");
  EXPECT_TRUE(CheckPush({{"refs/heads/agent/*"}, false}, del).allowed());
}

TEST_F(GitTest, RefsOutsideAllowRefsAreRefused) {
  ASSERT_TRUE(InitRepos());
  Commit("two");
  const std::string r_body = CapturePush("HEAD:refs/heads/main HEAD:refs/heads/agent/x HEAD:refs/tags/v1");
  ReceivePackRequest r = MustParse(r_body);
  ASSERT_EQ(r.updates.size(), 3u);
  PushVerdict verdict = CheckPush({{"refs/heads/agent/*"}, false}, r);
  ASSERT_EQ(verdict.refused.size(), 2u);
  EXPECT_EQ(verdict.refused[0].reason, "push to refs/heads/main refused by policy");
  EXPECT_EQ(verdict.refused[1].reason, "push to refs/tags/v1 refused by policy");
  EXPECT_TRUE(CheckPush({{}, false}, r).allowed());
  EXPECT_TRUE(CheckPush({{"refs/heads/**", "refs/tags/*"}, true}, r).allowed());
}

TEST_F(GitTest, PushOptionsPrecedeThePack) {
  ASSERT_TRUE(InitRepos());
  Sh("git config receive.advertisePushOptions true", "remote.git");
  Commit("two");
  const std::string r_body = CapturePush("-o ci.skip -o reviewer=x HEAD:refs/heads/main");
  ReceivePackRequest r = MustParse(r_body);
  EXPECT_TRUE(r.push_options);
  EXPECT_EQ(r.pack.substr(0, 4), "PACK");
  EXPECT_EQ(KindOf(r), UpdateKind::kFastForward);
}

// Commit messages that slide along one text, ten blocks at a time, so that
// pack-objects deltifies each commit on its neighbour and chains form.
std::vector<std::string> SlidingMessages(std::size_t n) {
  std::vector<std::string> blocks = Blocks(n + 10, 300);
  std::vector<std::string> messages;
  for (std::size_t i = 0; i < n; ++i) {
    std::string message;
    for (std::size_t j = i; j < i + 10; ++j) message += blocks[j] + "\n";
    messages.push_back(message);
  }
  return messages;
}

TEST_F(GitTest, DeltifiedCommitsOfsAndRef) {
  ASSERT_TRUE(InitRepos());
  std::string old_tip = Head();
  for (const std::string& m : SlidingMessages(16)) Commit(m);
  std::string tip = Head();

  for (const char* ofs : {"--delta-base-offset", ""}) {
    SCOPED_TRACE(*ofs ? "OFS_DELTA" : "REF_DELTA");
    Sh(std::string("printf 'HEAD\\n^") + old_tip + "\\n' | git pack-objects --revs --stdout --window=50 --depth=50 " +
           ofs + " > ../pack",
       "work");
    std::string pack = ReadFile(Path("pack"));
    std::string verify =
        Sh("cp pack check.pack && git index-pack check.pack >/dev/null && git verify-pack -v check.idx");
    ASSERT_NE(verify.find("chain length = 2"), std::string::npos) << verify;  // deltas on deltas

    std::string body = Body({{old_tip, tip, "refs/heads/main"}}, "report-status side-band-64k", pack);
    ReceivePackRequest r = MustParse(body);
    Result<PackIndex> index = PackIndex::Build(r.pack, 40);
    ASSERT_TRUE(index.ok()) << index.status().ToString();
    EXPECT_EQ(index->commit_count(), 16u);
    EXPECT_GE(index->resolved_deltas(), 10u);
    EXPECT_EQ(index->unresolved_deltas(), 0u);
    EXPECT_EQ(Classify(r.updates[0], *index), UpdateKind::kFastForward);
    EXPECT_TRUE(CheckPush({{}, true}, r).allowed());

    PackLimits depth;
    depth.max_delta_depth = 1;
    EXPECT_NE(PackErrorOf(r.pack, depth).find("max_delta_depth"), std::string::npos);
  }
  // What git push itself sends (a thin pack) deltifies them too.
  const std::string pushed_body = CapturePush("HEAD:refs/heads/main");
  ReceivePackRequest pushed = MustParse(pushed_body);
  Result<PackIndex> index = PackIndex::Build(pushed.pack, 40);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_GE(index->resolved_deltas(), 5u);
  EXPECT_EQ(Classify(pushed.updates[0], *index), UpdateKind::kFastForward);
}

TEST_F(GitTest, Sha256Repositories) {
  if (!InitRepos("sha256")) GTEST_SKIP() << "not applicable here: this git cannot make SHA-256 repositories";
  std::string old_tip = Head();
  ASSERT_EQ(old_tip.size(), 64u);
  Commit("two");
  std::string tip = Commit("three");
  const std::string r_body = CapturePush("HEAD:refs/heads/main");
  ReceivePackRequest r = MustParse(r_body);
  EXPECT_TRUE(r.HasCapability("object-format=sha256"));
  EXPECT_EQ(r.oid_hex_len, 64u);
  ASSERT_EQ(r.updates.size(), 1u);
  EXPECT_EQ(r.updates[0], (RefUpdate{old_tip, tip, "refs/heads/main"}));
  EXPECT_EQ(KindOf(r), UpdateKind::kFastForward);

  WriteFile(Path("msg"), "three, amended");
  Sh("git commit -q --amend --allow-empty -F " + Quote(Path("msg")), "work");
  const std::string forced_body = CapturePush("--force HEAD:refs/heads/main");
  ReceivePackRequest forced = MustParse(forced_body);
  EXPECT_EQ(KindOf(forced), UpdateKind::kNotProvenFastForward);
  EXPECT_EQ(PackErrorOf(forced.pack, {}, 40).find("(built)"), std::string::npos);  // the wrong hash fails
}

TEST_F(GitTest, CorruptedRealPacks) {
  ASSERT_TRUE(InitRepos());
  Commit("two");
  const std::string r_body = CapturePush("HEAD:refs/heads/main");
  ReceivePackRequest r = MustParse(r_body);
  std::string pack(r.pack);
  ASSERT_GT(pack.size(), 40u);
  // The first object's header is one or two bytes; its zlib stream follows.
  std::string corrupt = pack;
  for (std::size_t i = 16; i < 24; ++i) corrupt[i] = static_cast<char>(corrupt[i] ^ 0x5a);
  EXPECT_NE(PackErrorOf(corrupt).find("pack: object at offset 12"), std::string::npos) << PackErrorOf(corrupt);
  EXPECT_NE(PackErrorOf(pack.substr(0, pack.size() / 2)).find("pack:"), std::string::npos);

  std::string body = Body(r.updates, "report-status", corrupt);
  ReceivePackRequest corrupted = MustParse(body);
  PushVerdict verdict = CheckPush({{}, true}, corrupted);
  ASSERT_EQ(verdict.refused.size(), 1u);
  EXPECT_EQ(verdict.refused[0].reason.rfind("update of refs/heads/main refused by policy: pack: ", 0), 0u)
      << verdict.refused[0].reason;
}

// --- CheckPush without git --------------------------------------------------------

TEST(CheckPush, ThePackIsReadOnlyWhenNeeded) {
  ReceivePackRequest r;
  r.updates = {{kOld, kNew, "refs/heads/agent/x"}};
  r.pack = "not a pack";
  EXPECT_TRUE(CheckPush({{}, false}, r).allowed());  // no deny_force: never parsed
  PushVerdict verdict = CheckPush({{}, true}, r);
  ASSERT_EQ(verdict.refused.size(), 1u);
  EXPECT_EQ(verdict.refused[0].reason.rfind("update of refs/heads/agent/x refused by policy: pack: ", 0), 0u);

  r.updates = {{Zeros(40), kNew, "refs/heads/agent/x"}, {kNew, kNew, "refs/heads/agent/y"}};
  EXPECT_TRUE(CheckPush({{}, true}, r).allowed());  // a create and a no-op need no pack
  r.updates = {{kOld, kNew, "refs/heads/main"}};
  verdict = CheckPush({{"refs/heads/agent/*"}, true}, r);
  ASSERT_EQ(verdict.refused.size(), 1u);
  EXPECT_EQ(verdict.refused[0].reason, "push to refs/heads/main refused by policy");
}

// --- RefusalResponseBody ----------------------------------------------------------

ReceivePackRequest TwoRefs(std::vector<std::string> caps) {
  ReceivePackRequest r;
  r.updates = {{kOld, kNew, "refs/heads/main"}, {Zeros(40), kNew, "refs/heads/agent/x"}};
  r.capabilities = std::move(caps);
  return r;
}

PushVerdict MainRefused(const ReceivePackRequest& r) {
  return PushVerdict{{{r.updates[0], "push to refs/heads/main refused by policy"}}};
}

const std::string kReport =
    PktLine("unpack ok\n") + PktLine("ng refs/heads/main agentbox: push to refs/heads/main refused by policy\n") +
    PktLine("ng refs/heads/agent/x agentbox: not applied: another ref in this push was refused\n") + "0000";

TEST(RefusalResponseBody, ReportStatusWithoutSideBand) {
  ReceivePackRequest r = TwoRefs({"report-status"});
  EXPECT_EQ(RefusalResponseBody(r, MainRefused(r)), kReport);
  r = TwoRefs({"report-status-v2"});
  EXPECT_EQ(RefusalResponseBody(r, MainRefused(r)), kReport);
  r = TwoRefs({"agent=x"});
  EXPECT_EQ(RefusalResponseBody(r, MainRefused(r)), "");
}

TEST(RefusalResponseBody, SideBandCarriesTheReportAndTheMessage) {
  ReceivePackRequest r = TwoRefs({"report-status", "side-band-64k"});
  EXPECT_EQ(RefusalResponseBody(r, MainRefused(r)),
            PktLine("\2agentbox: push to refs/heads/main refused by policy\n") + PktLine("\1" + kReport) + "0000");
  r = TwoRefs({"side-band"});
  EXPECT_EQ(RefusalResponseBody(r, MainRefused(r)),
            PktLine("\2agentbox: push to refs/heads/main refused by policy\n") + "0000");
}

TEST(RefusalResponseBody, SideBandPacketsStayWithinTheirSize) {
  ReceivePackRequest r;
  r.capabilities = {"report-status", "side-band"};
  PushVerdict verdict;
  for (int i = 0; i < 40; ++i) {
    r.updates.push_back({kOld, kNew, "refs/heads/agent/" + std::string(40, 'a') + std::to_string(i)});
    verdict.refused.push_back({r.updates.back(), "forced update of " + r.updates.back().ref + " refused by policy"});
  }
  std::string body = RefusalResponseBody(r, verdict);
  std::string band1;
  std::size_t pos = 0;
  while (pos < body.size()) {
    std::size_t len = std::stoul(body.substr(pos, 4), nullptr, 16);
    if (len == 0) {
      pos += 4;
      break;
    }
    EXPECT_LE(len, 1000u);
    if (body[pos + 4] == '\1') band1 += body.substr(pos + 5, len - 5);
    pos += len;
  }
  EXPECT_EQ(pos, body.size());
  EXPECT_EQ(band1.substr(0, 14), PktLine("unpack ok\n"));
  EXPECT_EQ(band1.substr(band1.size() - 4), "0000");
  EXPECT_GT(band1.size(), 2000u);
}

// The response as git shows it: a push to a fake receive-pack that answers
// what RefusalResponseBody makes of the request git sent.
TEST_F(GitTest, GitPrintsTheRefusal) {
  ASSERT_TRUE(InitRepos());
  SetUpFake();
  std::string before = Head("main", "remote.git");
  Commit("two");
  std::string advertisement = Sh("git receive-pack --advertise-refs .", "remote.git");

  // First the request (the answer is empty: git fails), then the same push again, answered.
  PushToFake("HEAD:refs/heads/main HEAD:refs/heads/agent/x", advertisement, "");
  const std::string request = ReadFile(Path("fake/request"));
  ReceivePackRequest first = MustParse(request);
  ASSERT_EQ(first.updates.size(), 2u);
  PushVerdict verdict = CheckPush({{"refs/heads/agent/*"}, false}, first);
  ASSERT_EQ(verdict.refused.size(), 1u);
  Ran push =
      PushToFake("HEAD:refs/heads/main HEAD:refs/heads/agent/x", advertisement, RefusalResponseBody(first, verdict));
  EXPECT_NE(push.code, 0);
  EXPECT_NE(push.out.find("remote: agentbox: push to refs/heads/main refused by policy"), std::string::npos)
      << push.out;
  EXPECT_NE(push.out.find("! [remote rejected] HEAD -> main (agentbox: push to refs/heads/main refused by policy)"),
            std::string::npos)
      << push.out;
  EXPECT_NE(push.out.find("! [remote rejected] HEAD -> agent/x (agentbox: not applied: another ref in this push "
                          "was refused)"),
            std::string::npos)
      << push.out;
  const std::string again = ReadFile(Path("fake/request"));
  EXPECT_EQ(MustParse(again).capabilities, first.capabilities);
  EXPECT_EQ(Head("main", "remote.git"), before);
}

TEST_F(GitTest, GitPrintsTheRefusalWithoutSideBand) {
  ASSERT_TRUE(InitRepos());
  SetUpFake();
  Commit("two");
  // An advertisement without side-band: the report alone carries the reason.
  std::string advertisement = PktLine(Head("main", "remote.git") + " refs/heads/main" + std::string(1, '\0') +
                                      "report-status delete-refs ofs-delta object-format=sha1 agent=test\n") +
                              "0000";
  PushToFake("HEAD:refs/heads/main", advertisement, "");
  const std::string request = ReadFile(Path("fake/request"));
  ReceivePackRequest first = MustParse(request);
  EXPECT_FALSE(first.HasCapability("side-band-64k"));
  ASSERT_TRUE(first.HasCapability("report-status"));
  PushVerdict verdict = CheckPush({{"refs/heads/agent/*"}, false}, first);
  Ran push = PushToFake("HEAD:refs/heads/main", advertisement, RefusalResponseBody(first, verdict));
  EXPECT_NE(push.code, 0);
  EXPECT_NE(push.out.find("! [remote rejected] HEAD -> main (agentbox: push to refs/heads/main refused by policy)"),
            std::string::npos)
      << push.out;
  EXPECT_EQ(push.out.find("remote: agentbox"), std::string::npos) << push.out;
}

}  // namespace
}  // namespace agentbox::net
