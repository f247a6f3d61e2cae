// Local calls: a call to an RpcServer of this same process, run on the
// calling thread instead of over a socket.
//
// `cistern up --mount` runs the FUSE mount in the process that serves the
// metadata; a metadata call from a FUSE thread would otherwise cross
// loopback TCP twice and wake three threads (the server's I/O thread, a
// blocking-pool thread, the I/O thread again) to run a function the FUSE
// thread could run itself. RpcClient::callSync() asks callLocal() first when
// ClientOptions::local_calls is on: methods the server registered with
// handleLocal() run right there, with the server's per-method metrics, and
// the raw payloads are the caller's buffers (a read lands in the caller's
// buffer; a write is taken from the caller's). Anything else, or another
// process's endpoint, goes over the socket as before; so does a server
// listening on a wildcard address, which callers reach by another one. A
// local call is not bounded by the call's deadline or cancel token once it
// runs (what it runs is bounded on its own: a KV transaction, a synced
// commit, a chunk read or write). RpcServer::stop() stops taking local calls
// first and waits for those running.
#pragma once

#include <optional>
#include <span>
#include <string_view>

#include "common/status.h"
#include "net/endpoint.h"
#include "net/method.h"

namespace google::protobuf {
class Message;
}

namespace cistern::net {

// The handler's status, or nullopt when no started server of this process
// listens at `to` with a local handler for `method`. `*response_payload_len`
// (if not null) is set to the response payload bytes written into
// `response_payload`.
std::optional<Status> callLocal(const Endpoint& to, const Method& method,
                                const google::protobuf::Message& request,
                                google::protobuf::Message* response,
                                std::span<const uint8_t> request_payload,
                                std::span<uint8_t> response_payload, size_t* response_payload_len,
                                std::string_view credential = {});

// Whether a started server of this process at `to` has a local handler for `method`.
bool servedLocally(const Endpoint& to, const Method& method);

}  // namespace cistern::net
