#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "common/log.h"
#include "common/metrics.h"
#include "common/random.h"
#include "kv/engine.h"

namespace cistern::kv {

Status runTransaction(Engine& engine, const std::function<Status(Transaction&)>& body,
                      const RetryOptions& retry) {
  uint32_t backoff_ms = std::max<uint32_t>(1, retry.backoff_ms_initial);
  Status last;
  for (uint32_t attempt = 0; attempt < retry.attempts_max; ++attempt) {
    auto txn = engine.begin();
    Status s = body(*txn);
    if (s.ok()) s = txn->commit();
    if (s.ok()) return s;
    if (s.code() != ErrorCode::kTxnConflict && s.code() != ErrorCode::kTxnTooOld) return s;
    last = s;
    static auto& retries = metrics::Registry::global().counter(
        "kv_txn_retries_total", {}, "Transactions run again after a conflict or too-old read");
    retries.inc();
    txn.reset();
    // Full jitter: sleep uniformly in [0, backoff] so that colliding retries spread out.
    uint64_t sleep_us = threadLocalRandom().uniform(uint64_t{backoff_ms} * 1000 + 1);
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    backoff_ms = std::min(retry.backoff_ms_max, backoff_ms * 2);
  }
  return Status(ErrorCode::kTxnRetriesExhausted, fmt::format("gave up after {} attempts; last: {}",
                                                             retry.attempts_max, last.toString()));
}

Status runReadTransaction(Engine& engine, const std::function<Status(ReadTransaction&)>& body) {
  auto txn = engine.beginRead();
  return body(*txn);
}

}  // namespace cistern::kv
