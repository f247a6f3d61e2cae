// RpcClient: calls methods of RpcServers (frame format: frame.h).
//
//   RpcClient client(ClientOptions{});
//   EchoResponse resp;
//   Status s = client.callSync(endpoint, kEcho, req, &resp, {.timeout_ms = 1000});
//
// The client keeps connections_per_endpoint connections to each endpoint,
// opened on first use and re-opened after a failure, and multiplexes calls
// over them by request id. callSync() first tries a connection of its own
// from a small pool (sync_connections_per_endpoint), which the calling
// thread drives itself. At most inflight_per_connection_max calls are
// outstanding on a connection; more wait for a slot (backpressure), within
// their deadline. Raw payloads are sent from, and received straight into,
// caller-owned buffers without copies; the buffers must stay valid until the
// call returns, which it does only once the client no longer touches them.
//
// Every call ends with a Status: the handler's error as the server sent it,
// or kDeadlineExceeded, kCancelled, kConnectionFailed (cannot connect),
// kConnectionClosed (the connection broke during the call), kBadFrame,
// kBadMessage, kPayloadTooLarge (response payload larger than the buffer).
// Thread-safe: call from any thread or coroutine. REQUIRES: no thread is
// inside call()/callSync() when the destructor runs; coroutine calls still
// parked on the client's I/O threads are failed with kShuttingDown and the
// I/O threads are joined.
#pragma once

#include <asio/awaitable.hpp>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>

#include "common/status.h"
#include "net/endpoint.h"
#include "net/frame.h"
#include "net/method.h"

namespace google::protobuf {
class Message;
}

namespace cistern::net {

struct ClientOptions {
  // I/O threads. Default: 1.
  uint32_t threads = 1;
  // Connections kept to each endpoint. Default: 1.
  uint32_t connections_per_endpoint = 1;
  // Outstanding calls per connection. Default: 64.
  uint32_t inflight_per_connection_max = 64;
  // Time allowed to establish a connection. Default: 3000 ms.
  uint32_t connect_timeout_ms = 3000;
  // Deadline of calls that do not set one. Default: 30,000 ms.
  uint32_t call_timeout_ms = 30'000;
  // Connections to each endpoint that a callSync() owns for the whole call,
  // writing and reading on the calling thread (no I/O-thread hand-offs);
  // callSync() uses the shared connections when all are busy. 0 = none.
  // Default: 16.
  uint32_t sync_connections_per_endpoint = 16;
  // Checksum request payloads (messages are always checksummed). Default: true.
  bool payload_crc = true;
  // The credential of calls that set none (CallOptions::credential), asked
  // per call (a server's service token, a client's token). Empty: none.
  std::function<std::string()> credential;
  // callSync() to a server of this same process runs the methods it serves
  // locally on the calling thread (local_call.h). Default: false.
  bool local_calls = false;
  FrameLimits limits;
};

// Cancels calls from any thread. A call registered after cancel() fails at once.
class CancelToken {
 public:
  void cancel();
  bool cancelled() const { return cancelled_.load(); }
  // Internal: runs `fn` once on cancel (at once if already cancelled).
  uint64_t subscribe(std::function<void()> fn);
  void unsubscribe(uint64_t id);

 private:
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, std::function<void()>> callbacks_;
};

struct CallOptions {
  // 0 = ClientOptions::call_timeout_ms.
  uint32_t timeout_ms = 0;
  // Raw bytes sent after the request message.
  std::span<const uint8_t> request_payload;
  // Where a response payload is received; its size is the most accepted.
  std::span<uint8_t> response_payload;
  // Set to the number of response payload bytes received.
  size_t* response_payload_len = nullptr;
  uint8_t priority = 0;
  uint64_t tenant_token = 0;
  // The caller's token or capability (docs/security.md), sent before the
  // message; at most kCredentialBytesMax bytes. Empty: none.
  std::string_view credential;
  std::shared_ptr<CancelToken> cancel;
  // Set by callSync() to whether the call ran as a local call (local_call.h).
  bool* ran_locally = nullptr;
};

class RpcClient {
 public:
  explicit RpcClient(const ClientOptions& options = {});
  ~RpcClient();
  RpcClient(const RpcClient&) = delete;
  RpcClient& operator=(const RpcClient&) = delete;

  // For coroutines: resumes on the caller's executor.
  asio::awaitable<Status> call(const Endpoint& to, const Method& method,
                               const google::protobuf::Message& request,
                               google::protobuf::Message* response, CallOptions options = {});
  // Blocks the calling thread (must not be one of this client's I/O threads).
  Status callSync(const Endpoint& to, const Method& method,
                  const google::protobuf::Message& request, google::protobuf::Message* response,
                  CallOptions options = {});

  // Sets ClientOptions::credential. Before the first call.
  void setCredential(std::function<std::string()> credential);

  // Whether callSync(to, method, ...) would now run as a local call (local_call.h).
  bool callsLocally(const Endpoint& to, const Method& method) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace cistern::net
