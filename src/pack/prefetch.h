// Prefetcher: reads a pack's samples in a given order (a loader's epoch
// permutation) ahead of the consumer, with `threads` readers and at most
// `max_bytes` of samples read (or being read) and not yet taken — nothing
// read ahead is wasted, because the order is known. A reader claims
// kBatch positions at a time and reads the runs of them that fit the bound
// with PackReader::readMany: several samples per storage request. next()
// returns the samples in order. Each reader thread has its own PackReader
// (and index page cache of `cache_bytes`). Thread-safe for one consumer.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "pack/pack.h"

namespace cistern::pack {

class Prefetcher {
 public:
  struct Options {
    uint32_t threads = 4;
    uint64_t max_bytes = 256ull << 20;   // read ahead and not yet taken
    uint64_t cache_bytes = 16ull << 20;  // each reader's index pages
  };
  struct Sample {
    uint64_t index = 0;
    std::string name;
    int64_t label = kNoLabel;
    std::vector<uint8_t> bytes;
  };
  // Starts reading `order` (sample indices) from the pack at `dir`.
  static Result<std::unique_ptr<Prefetcher>> start(Client& client, const std::string& dir,
                                                   std::vector<uint64_t> order, Options options);
  ~Prefetcher();
  // The next sample in order; nullopt after the last. An error (a sample
  // that fails its checksum) is returned once, in its place.
  Result<std::optional<Sample>> next();
  uint64_t peakBytes() const;  // most bytes held at once (<= max_bytes + one sample)
  static constexpr size_t kBatch = 32;

 private:
  Prefetcher(std::vector<uint64_t> order, Options options)
      : order_(std::move(order)), options_(options) {}
  void run(PackReader* reader);

  std::vector<uint64_t> order_;
  Options options_;
  std::vector<std::unique_ptr<PackReader>> readers_;
  std::vector<std::thread> threads_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  size_t claimed_ = 0;     // positions in order_ handed to readers
  size_t taken_ = 0;       // positions returned by next()
  uint64_t held_ = 0;      // bytes read and not taken
  uint64_t reserved_ = 0;  // bytes being read
  uint64_t peak_ = 0;
  bool stop_ = false;
  std::map<size_t, Result<Sample>> done_;  // by position
};

}  // namespace cistern::pack
