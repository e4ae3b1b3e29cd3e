// TCP connections carried over one framed channel (linux/microvm.h's
// frames): the egress of a sandbox that has no network device. The inside
// end accepts on its loopback listeners and announces each connection; the
// outside end dials the supervisor's proxy for it. Bytes flow both ways in
// kConnData frames, each direction with a window of kMuxWindow bytes not yet
// acknowledged: neither end holds more than that per connection, and a
// connection that stops reading stalls itself, never the channel.
//
// Payloads: kConnOpen = id (4 bytes, little endian) + tag (1 byte, which
// listener); kConnData = id + bytes; kConnAck = id + count (4 bytes);
// kConnEnd = id (the sender will send no more: a half close); kConnAbort = id
// (the connection is gone; drop it).
//
// A descriptor can also be attached to an id both ends agreed on beforehand
// (Attach: a pipe or a socket handed over with a request, a session's call),
// flowing one way or both; such ids are the outside's and have kMuxAttached
// set, so they never meet the inside's.
#pragma once

#include <poll.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "linux/fd.h"
#include "linux/microvm.h"

namespace agentbox::linux {

inline constexpr std::size_t kMuxWindow = 64u << 10;
inline constexpr std::size_t kMuxChunk = 16u << 10;
inline constexpr std::size_t kMuxMaxConnections = 1024;
inline constexpr std::uint32_t kMuxAttached = 0x80000000u;

// Which way an attached descriptor's bytes go.
enum class MuxFlow {
  kBoth,  // a socket: read here and sent, and what comes written to it
  kOut,   // read here and sent (a pipe's read end); nothing is written to it
  kIn,    // what comes is written to it (a pipe's write end); it is not read
};

class StreamMux {
 public:
  // Writes one frame on the channel; false once it is broken.
  using SendFrame = std::function<bool(FrameType, std::string_view)>;
  // The outside's: a connected socket for a connection the inside announced
  // with `tag`, or an invalid fd (the connection is aborted).
  using Dial = std::function<UniqueFd(char tag)>;

  StreamMux(SendFrame send, Dial dial = nullptr);

  // The inside's: a connection accepted on the listener `tag` names.
  void Accept(UniqueFd fd, char tag);

  // `fd` carries connection `id` from now on, without a kConnOpen: the
  // other end attaches its own descriptor to the same id. The descriptor is
  // made non-blocking. False (and `fd` closed) for an id in use or too many.
  //  - `after` (an attached id, 0: none): this connection's bytes keep
  //    their order behind that one's, both ways: nothing of this one is read
  //    here while that one's fd has bytes to read and room in its window,
  //    nor written while that one has bytes waiting to be written (a call's
  //    result never overtakes its output);
  //  - `write_cap`: at most that many bytes are written to `fd`; what comes
  //    beyond is acknowledged and dropped (a log's size limit).
  struct AttachOptions {
    std::uint32_t after = 0;
    std::uint64_t write_cap = ~std::uint64_t{0};
  };
  bool Attach(std::uint32_t id, UniqueFd fd, MuxFlow flow, AttachOptions options);
  bool Attach(std::uint32_t id, UniqueFd fd, MuxFlow flow) { return Attach(id, std::move(fd), flow, {}); }

  // Ends connection `id` (a kConnAbort to the other end): for an attached
  // id whose request could not be made whole.
  void Drop(std::uint32_t id) { Abort(id, true); }

  // A frame from the channel: true when it was one of the mux's (handled),
  // false when it is some other frame. A malformed one aborts its connection.
  bool Handle(const Frame& frame);

  // Appends the pollfds of the open connections; Service takes the same
  // entries back (`fds` points at the first one appended) after poll(2).
  void AppendPollFds(std::vector<pollfd>* fds);
  void Service(const pollfd* fds, std::size_t n);

  std::size_t open() const { return conns_.size(); }

 private:
  struct Conn {
    UniqueFd fd;
    std::string out;            // from the channel, to be written to fd
    std::size_t unacked = 0;    // sent on the channel, not yet acknowledged
    bool read_end = false;      // fd's end of file seen (kConnEnd sent)
    bool peer_end = false;      // kConnEnd received
    bool shut_wr = false;       // shutdown(SHUT_WR) done
    bool socket = true;         // else read(2)/write(2), and closed instead of shut down
    std::uint32_t after = 0;    // AttachOptions::after
    std::uint64_t write_room = ~std::uint64_t{0};  // what may still be written to fd
  };
  // The connection `c` keeps its order behind, if it is still open.
  Conn* Before(const Conn& c);
  void Abort(std::uint32_t id, bool tell);
  void ReadFrom(std::uint32_t id, Conn* c);
  void WriteTo(std::uint32_t id, Conn* c);
  void MaybeFinish(std::uint32_t id);
  // Reads what the connection `id` keeps its order behind has waiting:
  // false when that one's window is full (so `id` must not be read now).
  bool DrainBefore(std::uint32_t id);
  bool Send(FrameType type, std::uint32_t id, std::string_view rest = {});

  SendFrame send_;
  Dial dial_;
  std::map<std::uint32_t, Conn> conns_;
  std::vector<std::uint32_t> polled_;  // ids in AppendPollFds' order
  std::uint32_t next_id_ = 1;
};

}  // namespace agentbox::linux
