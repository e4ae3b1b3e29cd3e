// sandbox.isolation: microvm: the pieces of a run in a QEMU microVM that
// are not supervision: the channel's frames, the guest's request, the
// initramfs (agentbox's own static binary as the guest's init), QEMU's and
// virtiofsd's command lines, and the host-side view each share exports.
//
// The guest kernel is a Debian kernel package's (linux-image-cloud-amd64);
// its virtio drivers are modules, which the initramfs carries and the init
// loads. Files reach the guest through virtiofs (QEMU's virtiofsd), one
// daemon per share; the command's stdio, signals and outcome travel over
// one virtio-serial port. The guest has no network device.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agentbox/plan.h"
#include "agentbox/status.h"
#include "linux/resolve.h"

namespace agentbox::linux {

// The virtio-serial port's name (/sys/class/virtio-ports/*/name).
inline constexpr const char* kGuestPortName = "agentbox";

// A frame on the channel: a type byte, the payload's length (4 bytes, little
// endian), the payload. At most kMaxFrame bytes of payload.
enum class FrameType : char {
  kRequest = 'r',   // host → guest: the GuestRequest (JSON)
  kStdin = 'i',     // host → guest: bytes for the command's stdin
  kStdinEnd = 'c',  // host → guest: stdin is at its end
  kSignal = 's',    // host → guest: forward this signal (decimal) to the command
  kStdout = 'o',    // guest → host: the command's stdout
  kStderr = 'e',    // guest → host: the command's stderr
  kResult = 'x',    // guest → host: the outcome (JSON), the last frame
  kFailure = 'f',   // guest → host: the guest could not run the request (JSON: stage, message, errno)
  // Egress (linux/stream_mux.h): connections carried over the channel.
  kConnOpen = 'n',   // guest → host: a connection on a listener of the guest's
  kConnData = 'd',   // both ways: bytes of a connection
  kConnAck = 'a',    // both ways: bytes of a connection written on
  kConnEnd = 'z',    // both ways: no more bytes of a connection from this end
  kConnAbort = 'k',  // both ways: a connection is gone
  // A session's world (GuestRequest::world; session/relayed_world.cc).
  kWorld = 'w',        // both ways: one message of the world's channel (JSON)
  kControl = 'C',      // host → guest: one request of the world's control socket (ControlFrame)
  kControlPart = 'P',  // host → guest: the first bytes of a kControl's text too long for one frame
};
inline constexpr std::size_t kMaxFrame = 1u << 20;

[[nodiscard]] Status WriteFrame(int fd, FrameType type, std::string_view payload);
// The same bytes appended to `out` (a payload over kMaxFrame as several frames).
void AppendFrame(std::string* out, FrameType type, std::string_view payload);

struct Frame {
  FrameType type;
  std::string payload;
};

// A request on a session world's control socket carried over the channel:
// its text and, for each descriptor it passed, the mux id that carries the
// descriptor's bytes (linux/stream_mux.h) and which way they go for the
// world's init: 'r' it reads (stdin), 'w' it writes (output, a result), 's'
// a stream socket, both ways. The payload: count (4 bytes), then per
// descriptor id (4 bytes) and the way (1 byte), then the text.
struct ControlDescriptor {
  std::uint32_t id = 0;
  char way = 'r';
};
struct ControlFrame {
  std::vector<ControlDescriptor> fds;
  std::string text;
};
// The frames of one request: kControlPart frames with the text's first
// bytes when it does not fit in one frame, then the kControl.
void AppendControlFrames(std::string* out, const ControlFrame& request);
// A kControl's payload, the text of the kControlPart frames before it in
// front: false when it is malformed.
bool ParseControlFrame(std::string_view payload, std::string parts, ControlFrame* out);

// Splits a byte stream into frames as it is read.
class FrameReader {
 public:
  // One read(2) of `fd`; whole frames are appended to `out`. False at end of
  // file, on an error, or on a malformed frame (then `error()` says which).
  bool Read(int fd, std::vector<Frame>* out);
  const std::string& error() const { return error_; }

 private:
  std::string buffer_;
  std::string error_;
};

// A directory the guest mounts from a virtiofs tag: the read-only system
// view at "/", each writable tree of the plan at its host path.
struct GuestShare {
  std::string tag;
  std::string path;
  bool writable = false;
};

struct GuestRequest {
  std::string plan_json;           // the plan the guest's runner applies (backend namespaces)
  std::vector<std::string> argv;
  std::vector<GuestShare> shares;  // "/" first
  bool stdin_open = false;         // stdin frames follow; else stdin is /dev/null
  // The caller's environment as the plan's rules leave it (built on the
  // host: the guest's init has an environment of its own).
  std::vector<std::string> env;
  std::uint64_t pids_max = 0;      // max_processes, as a pids cgroup of the guest's (0: none)
  // Egress: the guest's init listens on 127.0.0.1 at these ports (the ones
  // the command's proxy variables name) and carries each connection over
  // the channel to the supervisor's proxy (0: no egress, no listener).
  std::uint16_t proxy_http_port = 0;
  std::uint16_t proxy_socks_port = 0;
  // A session's world instead of one command (argv unused): the guest runs
  // the world's supervisor on the plan and relays its channel and the
  // calls' control requests (kWorld, kControl frames) until it ends.
  bool world = false;
};
std::string GuestRequestToJson(const GuestRequest& request);
Result<GuestRequest> GuestRequestFromJson(const std::string& text);

// The modules the guest needs, relative to /lib/modules/<release>/: virtio
// over MMIO, the serial port, virtiofs.
const std::vector<std::string>& GuestModules();

// GuestModules() and what they depend on (modules.dep), dependencies first:
// the order the guest's init loads them in.
Result<std::vector<std::string>> GuestModuleOrder(const std::string& release);

// Writes an uncompressed newc cpio to `out`: /init (the file `init`),
// /dev/console, the mount points, and GuestModules() of `release` under
// /lib/modules with /modules.order listing them. Errors name the path.
[[nodiscard]] Status WriteGuestInitramfs(const std::string& init, const std::string& release,
                                         const std::string& out);

// The release of a /boot/vmlinuz-RELEASE kernel ("" when the name is not one).
std::string KernelRelease(const std::string& kernel_path);

struct QemuRun {
  MicrovmPlan vm;
  std::string control_socket;                 // the virtio-serial port's chardev (QEMU connects)
  std::vector<std::pair<std::string, std::string>> fs_sockets;  // tag, virtiofsd socket
  std::string console_log;                    // the guest kernel's console
};
std::vector<std::string> QemuArgv(const QemuRun& run);

// A trial boot: the guest's init sees kGuestTrialArg on its command line,
// prints kGuestTrialReady on the console (QEMU's stdout) and powers off.
inline constexpr const char* kGuestTrialArg = "agentbox.trial=1";
inline constexpr const char* kGuestTrialReady = "agentbox-guest-ready";
std::vector<std::string> QemuTrialArgv(const std::string& qemu, const std::string& kernel,
                                       const std::string& initramfs, const std::string& accel);

// virtiofsd serving `source` on `socket` (it sandboxes itself in namespaces
// of its own and pivots into `source`).
std::vector<std::string> VirtiofsdArgv(const std::string& virtiofsd, const std::string& socket,
                                       const std::string& source);

// Runs in a child in a mount namespace of its own, before virtiofsd is
// exec'd: makes what the share exports the plan's view, so that not even a
// compromised guest kernel reaches more than the command may.
//  - the "/" share (`writable` false): a tmpfs at `staging` with every
//    read-only source of the plan bound read-only at its host path, the
//    mount points of the writable shares, /dev, /proc, /sys, /tmp, /run;
//  - a writable share: `source` itself.
// In both, every mask of the plan below the exported tree is bound over
// with an empty mode-0 file or directory, and every protected path is
// bound read-only onto itself.
[[nodiscard]] Status PrepareShareView(const ResolvedPlan& resolved, const GuestShare& share,
                                      const std::string& staging, const std::string& empty_file,
                                      const std::string& empty_dir);

// The host path that `target` (a path inside) is bound from, through the
// plan's binds; "" when no bind covers it.
std::string HostPathOf(const std::string& target, const ResolvedPlan& resolved);

// The writable trees the plan binds (host paths, outermost first).
std::vector<std::string> WritableSources(const ResolvedPlan& resolved);

}  // namespace agentbox::linux
