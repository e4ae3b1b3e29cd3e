// Set-id bits: the workspace is nosuid inside the sandbox, but a mode bit
// set there stays on the host file, where anyone who runs it later gets
// its owner's rights (root's, when agentbox runs as root). No call that
// would leave a set-uid or set-gid file behind gets through, and each is
// reported with the path it named.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>

#include "harness.h"

namespace agentbox::e2e {
namespace {

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0 ? st.st_mode : 0;
}

bool HasSetIdDenial(const RunResult& r, const std::string& op, const std::string& target) {
  if (!r.report || !(*r.report)["denials"].is_array()) return false;
  for (const auto& d : (*r.report)["denials"]) {
    if (d.value("facet", "") == "filesystem" && d.value("op", "") == op && d.value("target", "") == target &&
        d.value("reason", "") == "set-id bits") {
      return true;
    }
  }
  return false;
}

class SetId : public testing::TestWithParam<std::vector<std::string>> {};

TEST_P(SetId, NoSetIdFileReachesTheHost) {
  ASSERT_FALSE(FindTool("python3").empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  Sandbox box;
  WriteFile(box.ws() + "/tool", "#!/bin/sh\nid\n", 0755);
  const std::string script =
      "for m in 4755 2755 6755 u+s g+s; do chmod $m tool; echo chmod-$m=$?; done\n"
      "install -m 4755 tool tool2; echo install=$?\n"
      "python3 - <<'PY'\n"
      "import os, stat\n"
      "def attempt(name, f):\n"
      "    try:\n"
      "        f(); print(name, 'ok')\n"
      "    except OSError as e:\n"
      "        print(name, 'errno=%d' % e.errno)\n"
      "attempt('open', lambda: os.close(os.open('created', os.O_CREAT | os.O_WRONLY, 0o4755)))\n"
      "fd = os.open('plain', os.O_CREAT | os.O_WRONLY, 0o755)\n"
      "attempt('fchmod', lambda: os.fchmod(fd, 0o2755))\n"
      "attempt('mkdir', lambda: os.mkdir('dir', 0o2755))\n"
      "attempt('mknod', lambda: os.mknod('node', 0o4755 | stat.S_IFREG))\n"
      "attempt('tmpfile', lambda: os.close(os.open('.', os.O_TMPFILE | os.O_WRONLY, 0o4755)))\n"
      "attempt('chmod-plain', lambda: os.chmod('plain', 0o700))\n"
      "PY\n"
      "exit 3\n";
  RunResult r = box.Sh(script, GetParam());
  for (const char* m : {"4755", "2755", "6755", "u+s", "g+s"}) {
    EXPECT_TRUE(Contains(r.out, std::string("chmod-") + m + "=1")) << m << "\n" << r.Describe();
  }
  for (const char* what : {"open errno=1", "fchmod errno=1", "mkdir errno=1", "mknod errno=1", "tmpfile errno=1",
                           "chmod-plain ok"}) {
    EXPECT_TRUE(Contains(r.out, what)) << what << "\n" << r.Describe();
  }
  for (const char* f : {"tool", "tool2", "created", "plain", "dir", "node"}) {
    EXPECT_EQ(ModeOf(box.ws() + "/" + f) & (S_ISUID | S_ISGID), 0u) << f << " is set-id on the host";
  }
  EXPECT_EQ(ModeOf(box.ws() + "/plain") & 07777, 0700u);
  EXPECT_TRUE(HasSetIdDenial(r, "chmod", "tool")) << r.Describe();
  EXPECT_TRUE(HasSetIdDenial(r, "create", "created")) << r.Describe();
  EXPECT_TRUE(HasSetIdDenial(r, "create", "dir")) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
}

INSTANTIATE_TEST_SUITE_P(Backends, SetId,
                         testing::Values(std::vector<std::string>{},
                                         std::vector<std::string>{"--backend", "landlock", "--require", "partial"}),
                         [](const testing::TestParamInfo<std::vector<std::string>>& i) {
                           return std::string(i.param.empty() ? "namespaces" : "landlock");
                         });

}  // namespace
}  // namespace agentbox::e2e
