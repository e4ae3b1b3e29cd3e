#include "linux/microvm.h"
#include "linux/stream_mux.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <string>

namespace agentbox::linux {
namespace {

TEST(MicrovmFrames, RoundTripThroughAPipeAcrossReads) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  ASSERT_TRUE(WriteFrame(p[1], FrameType::kStdout, "hello").ok());
  ASSERT_TRUE(WriteFrame(p[1], FrameType::kStderr, std::string(30000, 'x')).ok());
  ASSERT_TRUE(WriteFrame(p[1], FrameType::kResult, "{}").ok());
  close(p[1]);
  FrameReader reader;
  std::vector<Frame> frames;
  while (reader.Read(p[0], &frames)) {
  }
  close(p[0]);
  EXPECT_TRUE(reader.error().empty()) << reader.error();
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[0].type, FrameType::kStdout);
  EXPECT_EQ(frames[0].payload, "hello");
  EXPECT_EQ(frames[1].payload.size(), 30000u);
  EXPECT_EQ(frames[2].type, FrameType::kResult);
}

TEST(MicrovmFrames, AnOversizedFrameIsAnErrorNotAnAllocation) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  const char header[5] = {'o', '\xff', '\xff', '\xff', '\x7f'};
  ASSERT_EQ(write(p[1], header, 5), 5);
  close(p[1]);
  FrameReader reader;
  std::vector<Frame> frames;
  EXPECT_FALSE(reader.Read(p[0], &frames));
  close(p[0]);
  EXPECT_TRUE(frames.empty());
  EXPECT_NE(reader.error().find("a frame of"), std::string::npos) << reader.error();
}

TEST(MicrovmRequest, RoundTripsAndRefusesWhatIsNotOne) {
  GuestRequest r;
  r.plan_json = "{\"confined\":true}";
  r.argv = {"sh", "-c", "echo hi"};
  r.shares = {{"ab0", "/", false}, {"ab1", "/work/ws", true}};
  r.stdin_open = true;
  r.env = {"PATH=/usr/bin", "LANG=C"};
  r.pids_max = 64;
  auto back = GuestRequestFromJson(GuestRequestToJson(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->plan_json, r.plan_json);
  EXPECT_EQ(back->argv, r.argv);
  ASSERT_EQ(back->shares.size(), 2u);
  EXPECT_EQ(back->shares[1].path, "/work/ws");
  EXPECT_TRUE(back->shares[1].writable);
  EXPECT_FALSE(back->shares[0].writable);
  EXPECT_TRUE(back->stdin_open);
  EXPECT_EQ(back->env, r.env);
  EXPECT_EQ(back->pids_max, 64u);
  EXPECT_FALSE(GuestRequestFromJson("{\"plan\":1}").ok());
  EXPECT_FALSE(GuestRequestFromJson("not json").ok());
}

ResolvedPlan Binds() {
  ResolvedPlan r;
  auto bind = [&](const std::string& source, const std::string& target, bool ro) {
    ResolvedMount m;
    m.op.kind = MountKind::kBind;
    m.op.source = source;
    m.op.target = target;
    m.op.read_only = ro;
    r.mounts.push_back(m);
  };
  bind("/usr", "/usr", true);
  bind("/etc", "/etc", true);
  bind("/home/u/project", "/workspace", false);
  bind("/home/u/.cache/pip", "/home/u/.cache/pip", false);
  bind("/home/u/project/sub", "/workspace/sub", false);
  return r;
}

TEST(MicrovmShares, HostPathOfFollowsTheInnermostBind) {
  const ResolvedPlan r = Binds();
  EXPECT_EQ(HostPathOf("/etc/shadow", r), "/etc/shadow");
  EXPECT_EQ(HostPathOf("/workspace/.env", r), "/home/u/project/.env");
  EXPECT_EQ(HostPathOf("/workspace", r), "/home/u/project");
  EXPECT_EQ(HostPathOf("/workspace/sub/.env", r), "/home/u/project/sub/.env");
  EXPECT_EQ(HostPathOf("/workspacex/a", r), "");
  EXPECT_EQ(HostPathOf("/root/.ssh", r), "");
}

TEST(MicrovmShares, WritableSourcesAreTheWritableBindsOutermostFirst) {
  const auto w = WritableSources(Binds());
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0], "/home/u/project");
  EXPECT_NE(std::find(w.begin(), w.end(), "/home/u/.cache/pip"), w.end());
  EXPECT_EQ(std::find(w.begin(), w.end(), "/usr"), w.end());
}

TEST(MicrovmQemu, NoNetworkDeviceModernVirtioAndOneFsDevicePerShare) {
  QemuRun run;
  run.vm.qemu = "/usr/bin/qemu-system-x86_64";
  run.vm.kernel = "/boot/vmlinuz-x";
  run.vm.initramfs = "/img";
  run.vm.accel = "tcg";
  run.vm.memory_mib = 384;
  run.vm.vcpus = 2;
  run.control_socket = "/run/d/ctl.sock";
  run.console_log = "/run/d/console.log";
  run.fs_sockets = {{"ab0", "/run/d/fs0.sock"}, {"ab1", "/run/d/fs1.sock"}};
  const auto a = QemuArgv(run);
  auto has = [&](const std::string& s) { return std::find(a.begin(), a.end(), s) != a.end(); };
  auto any_contains = [&](const std::string& s) {
    return std::any_of(a.begin(), a.end(), [&](const std::string& x) { return x.find(s) != std::string::npos; });
  };
  EXPECT_TRUE(has("-nodefaults"));
  EXPECT_TRUE(has("virtio-mmio.force-legacy=false"));
  EXPECT_FALSE(any_contains("-netdev"));
  EXPECT_FALSE(any_contains("-nic"));
  EXPECT_FALSE(any_contains("virtio-net"));
  EXPECT_TRUE(any_contains("microvm,accel=tcg"));
  EXPECT_TRUE(has("384M"));
  EXPECT_TRUE(any_contains("memory-backend-memfd,id=mem,size=384M,share=on"));
  EXPECT_TRUE(any_contains("vhost-user-fs-device,chardev=fs0,tag=ab0"));
  EXPECT_TRUE(any_contains("vhost-user-fs-device,chardev=fs1,tag=ab1"));
  EXPECT_TRUE(any_contains(std::string("virtserialport,chardev=ctl,name=") + kGuestPortName));
  EXPECT_TRUE(any_contains("panic=-1"));
  EXPECT_TRUE(any_contains("cryptomgr.notests"));
  run.vm.accel = "kvm";
  const auto k = QemuArgv(run);
  EXPECT_TRUE(std::any_of(k.begin(), k.end(), [](const std::string& x) { return x.find("accel=kvm") != std::string::npos; }));
  EXPECT_FALSE(std::any_of(k.begin(), k.end(), [](const std::string& x) { return x.find("tsc_early_khz") != std::string::npos; }));
}

TEST(MicrovmImage, KernelReleaseFromItsPath) {
  EXPECT_EQ(KernelRelease("/boot/vmlinuz-6.1.0-57-cloud-amd64"), "6.1.0-57-cloud-amd64");
  EXPECT_EQ(KernelRelease("/boot/vmlinuz-"), "");
  EXPECT_EQ(KernelRelease("/boot/initrd.img-6.1"), "");
}

// The host fact: a Debian kernel's modules.dep with the guest's modules.
std::string ReleaseWithVirtiofs() {
  std::string found;
  DIR* d = opendir("/lib/modules");
  if (!d) return found;
  while (dirent* e = readdir(d)) {
    const std::string rel = e->d_name;
    if (rel[0] != '.' && access(("/lib/modules/" + rel + "/kernel/fs/fuse/virtiofs.ko").c_str(), R_OK) == 0) {
      found = rel;
    }
  }
  closedir(d);
  return found;
}

TEST(MicrovmImage, ModulesComeAfterWhatTheyDependOnAndTheImageHasInit) {
  const std::string release = ReleaseWithVirtiofs();
  if (release.empty()) GTEST_SKIP() << "not applicable here: no kernel in /lib/modules with virtiofs.ko";
  auto order = GuestModuleOrder(release);
  ASSERT_TRUE(order.ok()) << order.status().ToString();
  auto at = [&](const std::string& m) {
    return std::find(order->begin(), order->end(), m) - order->begin();
  };
  ASSERT_LT(at("kernel/drivers/virtio/virtio_mmio.ko"), static_cast<long>(order->size()));
  EXPECT_LT(at("kernel/drivers/virtio/virtio_ring.ko"), at("kernel/drivers/virtio/virtio.ko"));
  EXPECT_LT(at("kernel/drivers/virtio/virtio.ko"), at("kernel/drivers/virtio/virtio_mmio.ko"));
  EXPECT_LT(at("kernel/fs/fuse/fuse.ko"), at("kernel/fs/fuse/virtiofs.ko"));

  char dir[] = "/tmp/agentbox-image-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string init = std::string(dir) + "/init", out = std::string(dir) + "/image";
  {
    int fd = open(init.c_str(), O_WRONLY | O_CREAT, 0755);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, "INITBINARY", 10), 10);
    close(fd);
  }
  ASSERT_TRUE(WriteGuestInitramfs(init, release, out).ok());
  std::string image;
  {
    int fd = open(out.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    char buf[65536];
    for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) image.append(buf, static_cast<size_t>(n));
    close(fd);
  }
  EXPECT_EQ(image.rfind("070701", 0), 0u);
  EXPECT_NE(image.find(std::string("init") + '\0'), std::string::npos);
  EXPECT_NE(image.find("INITBINARY"), std::string::npos);
  EXPECT_NE(image.find("/lib/modules/virtiofs.ko\n"), std::string::npos);
  EXPECT_NE(image.find("TRAILER!!!"), std::string::npos);
  EXPECT_FALSE(WriteGuestInitramfs(init, "no-such-release", out + "2").ok());
  unlink(init.c_str());
  unlink(out.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace agentbox::linux

namespace agentbox::linux {
namespace {

TEST(MicrovmControl, ARequestLongerThanAFrameComesBackWhole) {
  ControlFrame request;
  request.fds = {{kMuxAttached | 1, 'r'}, {kMuxAttached | 2, 'w'}, {kMuxAttached | 3, 's'}};
  request.text = std::string(kMaxFrame * 2 + 123, 'q');
  std::string wire;
  AppendControlFrames(&wire, request);
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  FrameReader reader;
  std::vector<Frame> frames;
  std::size_t off = 0;
  std::string parts;
  ControlFrame back;
  bool done = false;
  while (!done && off < wire.size()) {
    const std::size_t n = std::min<std::size_t>(65536, wire.size() - off);
    ASSERT_EQ(write(p[1], wire.data() + off, n), static_cast<ssize_t>(n));
    off += n;
    ASSERT_TRUE(reader.Read(p[0], &frames)) << reader.error();
    for (auto& f : frames) {
      if (f.type == FrameType::kControlPart) {
        parts += f.payload;
      } else {
        ASSERT_EQ(f.type, FrameType::kControl);
        ASSERT_TRUE(ParseControlFrame(f.payload, parts, &back));
        done = true;
      }
    }
    frames.clear();
  }
  close(p[0]);
  close(p[1]);
  ASSERT_TRUE(done);
  EXPECT_TRUE(back.text == request.text);
  ASSERT_EQ(back.fds.size(), 3u);
  EXPECT_EQ(back.fds[2].id, kMuxAttached | 3);
  EXPECT_EQ(back.fds[1].way, 'w');
  EXPECT_FALSE(ParseControlFrame(std::string("\x01\0\0\0\x05\0\0\0x", 9), "", &back)) << "an unknown way was taken";
  EXPECT_FALSE(ParseControlFrame(std::string("\x09\0\0\0", 4), "", &back)) << "more descriptors than a request has";
}

}  // namespace
}  // namespace agentbox::linux
