// Internal to RpcClient: a connection that one synchronous call at a time
// owns outright. The calling thread writes the request and reads the
// response itself, in blocking send and recv calls bounded by the socket's
// timeouts (two system calls per small call), instead of handing both to an
// I/O thread and sleeping on a future: a round trip costs the caller's thread
// no extra wake-ups. RpcClient keeps a bounded pool of these per endpoint
// (ClientOptions::sync_connections_per_endpoint) and falls back to the
// multiplexed connections when all are busy.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <span>
#include <string>

#include "common/clock.h"
#include "common/status.h"
#include "net/endpoint.h"
#include "net/frame.h"
#include "net/recv_buffer.h"

namespace google::protobuf {
class Message;
}

namespace cistern::net {

struct CallOptions;
struct ClientOptions;
struct Method;

// Serializes `request` into `*message` and fills the request header for it
// (shared with the multiplexed connections).
FrameHeader requestHeader(const Method& method, const google::protobuf::Message& request,
                          const CallOptions& options, uint32_t timeout_ms, bool payload_crc,
                          uint64_t request_id, std::string* message);

class SyncConnection {
 public:
  SyncConnection(Endpoint endpoint, const ClientOptions& options);
  ~SyncConnection();
  SyncConnection(const SyncConnection&) = delete;
  SyncConnection& operator=(const SyncConnection&) = delete;

  // One call, connecting first if needed. The caller has checked the request
  // payload size and that `options.cancel` is not yet cancelled. After a
  // deadline, a cancel or any transport failure the connection is closed
  // (the stream is out of step), and the next call reconnects.
  Status call(const Method& method, const google::protobuf::Message& request,
              google::protobuf::Message* response, const CallOptions& options, uint32_t timeout_ms);

 private:
  Status connect(SteadyTime deadline);
  // Closes the connection if it holds unasked bytes or, after sitting idle
  // for kTrustedIdle, if the peer has closed it.
  void dropIfClosedByPeer();
  void close();
  // Before each blocking send or recv: kCancelled, kDeadlineExceeded, or OK
  // with the socket's timeouts no longer than what is left of the deadline.
  Status arm(SteadyTime deadline, const CallOptions& options);
  // kCancelled when the call was cancelled (the cancel hook shut the socket
  // down, which is what failed), else `s`.
  Status cancelledOr(Status s, const CallOptions& options) const;
  Status writeAll(std::span<iovec> iov, SteadyTime deadline, const CallOptions& options);
  // Reads exactly `out.size()` bytes (buffered, large reads straight into `out`);
  // extends `*crc` over them when set.
  Status read(std::span<uint8_t> out, SteadyTime deadline, const CallOptions& options,
              uint32_t* crc);
  Status transportError(std::string_view what, int err) const;

  // A connection used this recently is reused without polling it first.
  static constexpr auto kTrustedIdle = std::chrono::milliseconds(100);

  const Endpoint endpoint_;
  const ClientOptions& options_;
  int fd_ = -1;
  std::chrono::milliseconds armed_{0};  // SO_RCVTIMEO and SO_SNDTIMEO of fd_
  SteadyTime last_used_{};              // end of the last call
  uint64_t next_request_id_ = 1;
  std::string call_name_;  // of the call in progress, for errors
  uint32_t call_timeout_ms_ = 0;
  std::string message_;  // request, then response message; reused
  RecvBuffer in_;        // bytes received and not yet consumed
};

}  // namespace cistern::net
