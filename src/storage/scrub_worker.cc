#include "storage/scrub_worker.h"

#include "common/log.h"
#include "common/metrics.h"

namespace cistern::storage {

ScrubWorker::ScrubWorker(ChunkEngine& engine, uint64_t bytes_per_second,
                         std::chrono::milliseconds pause, std::function<void(ChunkId)> on_bad)
    : engine_(engine),
      rate_(bytes_per_second),
      pause_(pause),
      on_bad_(std::move(on_bad)),
      thread_([this] { loop(); }) {}

ScrubWorker::~ScrubWorker() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t ScrubWorker::passes() const {
  std::lock_guard lock(mu_);
  return passes_;
}

std::vector<ChunkId> ScrubWorker::lastBad() const {
  std::lock_guard lock(mu_);
  return last_bad_;
}

void ScrubWorker::loop() {
  static auto& passes = metrics::Registry::global().counter("storage_scrub_passes_total", {},
                                                            "Completed scrub passes over a target");
  static auto& bad_now = metrics::Registry::global().gauge(
      "storage_scrub_bad_chunks", {}, "Chunks that failed verification in the last scrub pass");
  while (!stop_) {
    auto bad = engine_.scrub(rate_, &stop_);
    std::unique_lock lock(mu_);
    if (stop_) break;
    if (bad.ok()) {
      last_bad_ = std::move(bad).value();
      ++passes_;
      passes.inc();
      bad_now.set(static_cast<int64_t>(last_bad_.size()));
      for (const auto& id : last_bad_) {
        CLOG_ERROR("storage", "scrub: chunk {}:{} on {} fails verification", id.inode, id.index,
                   engine_.path());
      }
      if (on_bad_) {
        const auto bad_ids = last_bad_;
        lock.unlock();
        for (const auto& id : bad_ids) on_bad_(id);
        lock.lock();
        if (stop_) break;
      }
    } else {
      CLOG_WARN("storage", "scrub of {} stopped: {}", engine_.path(), bad.status().toString());
    }
    cv_.wait_for(lock, pause_, [this] { return stop_.load(); });
  }
}

}  // namespace cistern::storage
