// Internal to RpcClient: a connection that one synchronous call at a time
// owns outright. The calling thread writes the request and reads the
// response itself, with poll() for deadlines, instead of handing both to an
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
  // Closes the connection if the peer has closed it or sent unasked bytes.
  void dropIfClosedByPeer();
  void close();
  // Waits until the socket is ready for `events`; kDeadlineExceeded,
  // kCancelled (the cancel hook shut the socket down) or OK.
  Status wait(short events, SteadyTime deadline, const CallOptions& options);
  Status writeAll(std::span<iovec> iov, SteadyTime deadline, const CallOptions& options);
  // Reads exactly `out.size()` bytes (buffered, large reads straight into `out`);
  // extends `*crc` over them when set.
  Status read(std::span<uint8_t> out, SteadyTime deadline, const CallOptions& options,
              uint32_t* crc);
  Status transportError(std::string_view what, int err) const;

  const Endpoint endpoint_;
  const ClientOptions& options_;
  int fd_ = -1;
  uint64_t next_request_id_ = 1;
  std::string call_name_;  // of the call in progress, for errors
  uint32_t call_timeout_ms_ = 0;
  std::string message_;  // request, then response message; reused
  RecvBuffer in_;        // bytes received and not yet consumed
};

}  // namespace cistern::net
