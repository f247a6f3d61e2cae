// Expiry of idempotency records (docs/meta_kv_schema.md, "Idempotent
// mutations"). A record only serves a client that lost a reply and sends the
// same request again, which it does within its retry budget (seconds); kept
// for good, records would grow the KV with every mutation ever made.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/result.h"
#include "kv/engine.h"

namespace cistern::meta {

// How long records are kept by default: far past any client's retries.
inline constexpr int64_t kMutationRecordTtlNs = 5LL * 60 * 1'000'000'000;

// Deletes records committed at or before `now_ns - ttl_ns`, at most
// `max_deletes` of them; returns how many it deleted. A client's records are
// in request order, which is commit order up to its concurrent requests, so
// the scan stops at a client's first live record and goes on with the next
// client: the cost is the expired records plus one read per client.
Result<size_t> expireMutationRecords(kv::Engine& engine, int64_t now_ns, int64_t ttl_ns,
                                     size_t max_deletes = 10000);

}  // namespace cistern::meta
