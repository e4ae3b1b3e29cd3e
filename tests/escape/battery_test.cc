// The battery's own rules: how a probe's line and the host's result become a
// verdict. A crash, a timeout, a missing result or a failed test is never
// "blocked"; an attack the host itself cannot perform is "not applicable".
#include <gtest/gtest.h>

#include <cerrno>
#include <csignal>

#include "battery.h"

namespace agentbox::escape {
namespace {

Facts Ran(const std::string& inside_line, const std::string& attack) {
  Facts f;
  f.inside_ran = true;
  f.inside_status = 0;
  f.inside = ParseProbe(inside_line + "\n", attack);
  return f;
}

TEST(Battery, ACrashIsParsedAsNeitherOkNorBlocked) {
  Probe p = ParseProbe("RESULT i386_unshare crashed errno=0 signal=11 detail=i386 getpid through int 0x80: "
                       "killed by signal 11 (Segmentation fault)\n",
                       "i386_unshare");
  EXPECT_TRUE(p.present);
  EXPECT_FALSE(p.ok);
  EXPECT_TRUE(p.crashed);
  EXPECT_EQ(p.signal, SIGSEGV);
}

TEST(Battery, BlockedNeedsTheErrnoTheProbeGot) {
  Decision d = Decide(Ran("RESULT mount blocked errno=1 detail=mount tmpfs on /x: Operation not permitted", "mount"));
  EXPECT_EQ(d.verdict, Verdict::kBlocked);
  EXPECT_FALSE(d.skip);
  EXPECT_NE(d.why.find("errno=1 (Operation not permitted)"), std::string::npos) << d.why;
}

TEST(Battery, ACrashInsideIsNotJudgedAndFails) {
  Decision d = Decide(Ran("RESULT i386_unshare crashed errno=0 signal=11 detail=killed by signal 11", "i386_unshare"));
  EXPECT_EQ(d.verdict, Verdict::kNotJudged);
  EXPECT_FALSE(d.skip) << "a crash must fail the test, not skip it";
  EXPECT_NE(d.why.find("signal 11"), std::string::npos) << d.why;
}

TEST(Battery, ATimeoutIsNotJudged) {
  Facts f = Ran("RESULT forkbomb blocked errno=11 detail=fork: Resource temporarily unavailable", "forkbomb");
  f.inside_timed_out = true;
  EXPECT_EQ(Decide(f).verdict, Verdict::kNotJudged);
  EXPECT_FALSE(Decide(f).skip);
}

TEST(Battery, NoResultLineIsNotJudged) {
  Facts f = Ran("", "mount");
  f.inside_status = 139;
  Decision d = Decide(f);
  EXPECT_EQ(d.verdict, Verdict::kNotJudged);
  EXPECT_FALSE(d.skip);
  EXPECT_NE(d.why.find("exit 139"), std::string::npos) << d.why;
}

TEST(Battery, AFailedTestIsNeverBlocked) {
  Facts f = Ran("RESULT mount blocked errno=13 detail=mount: Permission denied", "mount");
  f.test_failed = true;  // e.g. the errno was not the seccomp filter's
  EXPECT_EQ(Decide(f).verdict, Verdict::kNotJudged);
  EXPECT_FALSE(Decide(f).skip);
}

TEST(Battery, AnAttackNeverTriedInsideIsNotJudged) {
  Facts f;
  EXPECT_EQ(Decide(f).verdict, Verdict::kNotJudged);
  EXPECT_FALSE(Decide(f).skip);
}

TEST(Battery, OkInsideIsAnEscapeForBothKinds) {
  Facts f = Ran("RESULT read ok errno=0 detail=read 40 bytes", "read");
  EXPECT_EQ(Decide(f).verdict, Verdict::kEscaped);
  f.kind = Kind::kSurface;
  EXPECT_EQ(Decide(f).verdict, Verdict::kEscaped);
  // Even when the host could not show the attack: working inside is worse.
  f.not_applicable = "the host refuses it";
  EXPECT_EQ(Decide(f).verdict, Verdict::kEscaped);
}

TEST(Battery, AHostCheckCanProveTheBlock) {
  // ~/.bashrc written inside the private HOME: the probe says ok, the host file is absent.
  Facts f = Ran("RESULT write ok errno=0 detail=wrote /home/u/.bashrc", "write");
  f.blocked = "no ~/.bashrc appeared on the host";
  EXPECT_EQ(Decide(f).verdict, Verdict::kBlocked);
  f.escaped = "~/.bashrc appeared on the host";
  EXPECT_EQ(Decide(f).verdict, Verdict::kEscaped);
}

// A host whose kernel serves no i386 syscalls: int 0x80 dies with SIGSEGV
// unconfined, and inside too (the filter never sees the call).
TEST(Battery, NoI386OnTheHostIsNotApplicable) {
  Probe host = ParseProbe("RESULT i386_unshare crashed errno=0 signal=11 detail=i386 getpid through int 0x80: "
                          "killed by signal 11 (Segmentation fault)\n",
                          "i386_unshare");
  const std::string why = HostRefusal(host, "the host refuses the i386 calls unconfined");
  EXPECT_EQ(why, "the kernel serves no i386 syscalls (int 0x80 dies with SIGSEGV unconfined)");
  Facts f = Ran("RESULT i386_unshare crashed errno=0 signal=11 detail=killed by signal 11", "i386_unshare");
  f.not_applicable = why;
  Decision d = Decide(f);
  EXPECT_EQ(d.verdict, Verdict::kNotApplicable);
  EXPECT_TRUE(d.skip);
  EXPECT_EQ(d.why, why);
}

TEST(Battery, AHostThatServesTheCallIsApplicable) {
  Probe host = ParseProbe("RESULT i386_unshare ok errno=0 detail=i386 getpid and unshare succeeded\n", "i386_unshare");
  EXPECT_EQ(HostRefusal(host, "x"), "");
  Probe refused = ParseProbe("RESULT mount blocked errno=1 detail=mount tmpfs on /t: Operation not permitted\n", "mount");
  EXPECT_EQ(HostRefusal(refused, "root here lacks CAP_SYS_ADMIN"),
            "root here lacks CAP_SYS_ADMIN: mount tmpfs on /t: Operation not permitted");
}

TEST(Battery, AKernelWithoutTheCallIsNotApplicable) {
  Probe host = ParseProbe("RESULT kexec_load blocked errno=38 detail=kexec_load: Function not implemented\n",
                          "kexec_load");
  EXPECT_EQ(HostRefusal(host, "root here lacks CAP_SYS_BOOT"),
            "this kernel does not provide it (ENOSYS unconfined): kexec_load: Function not implemented");
}

TEST(Battery, ALimitTheProductRefusedIsNotJudgedAndSkipped) {
  Facts f = Ran("RESULT membomb ok errno=0 detail=touched 256 MiB", "membomb");
  f.refused = "--memory is refused here (exit 125, fail closed)";
  Decision d = Decide(f);
  EXPECT_EQ(d.verdict, Verdict::kNotJudged);
  EXPECT_TRUE(d.skip);
  f.test_failed = true;
  EXPECT_FALSE(Decide(f).skip);
}

}  // namespace
}  // namespace agentbox::escape
