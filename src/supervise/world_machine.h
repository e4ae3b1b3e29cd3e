// A kernel of a session's world's own (a microVM's guest, a gVisor
// sandbox's Sentry) reached through one byte stream: the relay inside
// (guest_init.cc) runs the world's supervisor there, and this host relays
// the caller's channel and calls over the stream (session/relayed_world.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "agentbox/status.h"
#include "linux/fd.h"

namespace agentbox::supervise {

class Egress;

class WorldMachine {
 public:
  virtual ~WorldMachine() = default;
  // The stream to the inside's relay (a socket): frames both ways.
  virtual int channel() const = 0;
  // Readable once the machine's process (QEMU, runsc) has ended.
  virtual int ended_fd() const = 0;
  // read_only entries absent on this host (the report's enforcement.skipped).
  virtual const std::vector<std::string>& skipped() const = 0;
  // The proxy serving the inside's connections (null without egress), and
  // a connection to its listener for `tag` ('h' HTTP, 's' SOCKS).
  virtual Egress* egress() = 0;
  virtual linux::UniqueFd DialEgress(char tag) = 0;
  // Waits up to `grace` for the machine to end by itself, then ends it.
  virtual void Reap(std::chrono::milliseconds grace) = 0;
  // Once it ended: how, and whether it ran out of memory.
  virtual std::string EndedHow(bool* oom) = 0;
  // The world's memory limit while it runs.
  virtual Status SetMemory(std::uint64_t bytes) = 0;
  // Why a path cannot be grafted into it while it runs.
  virtual std::string GraftRefusal() const = 0;
  // The stage its errors carry ("microvm", "gvisor").
  virtual const char* stage() const = 0;
};

}  // namespace agentbox::supervise
