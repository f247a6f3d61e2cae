// The meta server's background work (meta_gc_loop.h).
#include "server/meta_gc_loop.h"

#include "common/clock.h"
#include "common/log.h"
#include "meta/meta_store.h"
#include "meta/record_expiry.h"

namespace cistern::server {

MetaGcLoop::MetaGcLoop(kv::Engine& kv, meta::MetaStore& meta, GcRemover& remover)
    : kv_(kv), meta_(meta), remover_(remover), thread_([this] { run(); }) {}

MetaGcLoop::~MetaGcLoop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void MetaGcLoop::run() {
  meta::GcWorker gc(kv_, remover_);
  std::unique_lock lock(mu_);
  auto next_expiry = std::chrono::steady_clock::now();
  const auto reap_every =
      std::max(std::chrono::milliseconds(1000),
               std::chrono::milliseconds(meta_.options().session_timeout_ms / 4));
  auto next_reap = std::chrono::steady_clock::now() + reap_every;
  while (!stopping_) {
    lock.unlock();
    // Sessions of clients that died first: their unlinked files become garbage.
    if (std::chrono::steady_clock::now() >= next_reap) {
      next_reap = std::chrono::steady_clock::now() + reap_every;
      auto reaped = meta_.reapSessions(1000, &remover_);
      if (!reaped.ok()) CLOG_WARN("gc", "ending sessions: {}", reaped.status().toString());
    }
    auto done = gc.runOnce();
    if (!done.ok()) CLOG_WARN("gc", "chunk GC: {}", done.status().toString());
    // Once a second, also while chunk GC is busy: the scan reads once per client.
    if (std::chrono::steady_clock::now() >= next_expiry) {
      next_expiry = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      auto expired = meta::expireMutationRecords(kv_, SystemClock::instance().wallMicros() * 1000,
                                                 meta::kMutationRecordTtlNs);
      if (!expired.ok()) CLOG_WARN("gc", "record expiry: {}", expired.status().toString());
    }
    lock.lock();
    // Busy while there is work; otherwise look again in a second.
    if (done.ok() && *done > 0) continue;
    cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stopping_; });
  }
}

}  // namespace cistern::server
