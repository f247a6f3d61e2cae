// ScrubWorker: re-reads every chunk of a target in the background.
//
// One thread runs ChunkEngine::scrub() passes paced at `bytes_per_second`,
// sleeping `pause` between passes. Chunks that fail verification are counted
// in storage_scrub_bad_chunks_total and listed by lastBad(); the
// storage_scrub_passes_total counter and the storage_scrub_bad_chunks gauge
// (bad chunks in the last pass) show progress. Repair from a replica comes
// with replication. The destructor stops the thread (mid-pass if needed).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "storage/chunk_engine.h"

namespace cistern::storage {

class ScrubWorker {
 public:
  // `on_bad`, if set, is called (from the worker's thread) with each chunk
  // that failed verification in a pass: a replica's repair.
  ScrubWorker(ChunkEngine& engine, uint64_t bytes_per_second,
              std::chrono::milliseconds pause = std::chrono::hours(24),
              std::function<void(ChunkId)> on_bad = {});
  ~ScrubWorker();

  uint64_t passes() const;
  std::vector<ChunkId> lastBad() const;

 private:
  void loop();

  ChunkEngine& engine_;
  uint64_t rate_;
  std::chrono::milliseconds pause_;
  std::function<void(ChunkId)> on_bad_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t passes_ = 0;
  std::vector<ChunkId> last_bad_;
  std::thread thread_;
};

}  // namespace cistern::storage
