// Internal to libcistern's chunk I/O files (data_io.cc, same_host_io.cc,
// chunk_calls.cc): where a chunk lives, which errors are retried, and the
// byte counters by path.
#pragma once

#include <fmt/format.h>

#include <thread>

#include "client/client_impl.h"
#include "common/metrics.h"
#include "storage.pb.h"

namespace cistern::client {

// The chain that holds chunk `index` of a file laid out so.
inline uint32_t chainOf(const meta::Layout& layout, uint64_t index) {
  return layout.chains(static_cast<int>(index % static_cast<uint64_t>(layout.chains_size())));
}

// Chunk bytes read or written, by the way they went: "shm" (same-host
// shared memory), "socket", "local" (a call to a server of this process,
// on the caller's buffer: net/local_call.h), or "short_circuit" (read from
// the server's files by this process).
inline metrics::Counter& readBytes(const char* path) {
  return metrics::Registry::global().counter("client_read_bytes_total", {{"path", path}},
                                             "Chunk bytes read from storage servers");
}
inline metrics::Counter& writeBytes(const char* path) {
  return metrics::Registry::global().counter("client_write_bytes_total", {{"path", path}},
                                             "Chunk bytes written to storage servers");
}

inline bool retryable(const Status& s) {
  return transient(s) || s.code() == ErrorCode::kStaleChainVersion ||
         s.code() == ErrorCode::kNotServing || s.code() == ErrorCode::kChunkNotCommitted;
}

// The call ended before its server answered: the server may still be using
// the shared memory it named.
inline bool endedUnanswered(const Status& s) {
  return s.code() == ErrorCode::kDeadlineExceeded || s.code() == ErrorCode::kCancelled ||
         s.code() == ErrorCode::kConnectionClosed || s.code() == ErrorCode::kBadFrame;
}

// The status of range `i` of a BatchRead: a hole (a chunk never written)
// is no error and reads as zero bytes got.
inline Status rangeStatus(const storage::BatchReadResp& resp, size_t* got, int i = 0) {
  auto code = resp.codes_size() > i ? static_cast<ErrorCode>(resp.codes(i)) : ErrorCode::kOk;
  if (code == ErrorCode::kNotFound) {
    *got = 0;
  } else if (code != ErrorCode::kOk) {
    return Status(code, fmt::format("the server answered {} for the range", errorCodeName(code)));
  }
  return Status::OK();
}

template <typename Once, typename What>
Status ClientImpl::retryBlocking(uint32_t chain, const Once& once, const What& what, bool fenced) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.retry_ms);
  std::chrono::milliseconds backoff(5);
  for (;;) {
    auto r = route(chain);
    Status s = r.ok() ? once(*r) : r.status();
    if (s.ok()) return s;
    if (auto end = giveUp(s, deadline, backoff, fenced)) return end->withContext(what());
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

}  // namespace cistern::client
