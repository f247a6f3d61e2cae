// Test support: a writer of whole files and readers that check every byte
// they read against the writer's record, in the background, on one client
// of a cluster (cluster_harness.h).
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "tests/cluster/cluster_harness.h"

namespace cistern::testing {

// A writer of whole files (create, one write, close) and readers that check
// what they read against the writer's record, in the background.
class Workload {
 public:
  explicit Workload(Client& c, int readers = 1) : c_(c) {
    writer_ = std::thread([this] { writeLoop(); });
    for (int i = 0; i < readers; ++i)
      readers_.emplace_back([this, i] { readLoop(static_cast<uint64_t>(i) + 1); });
  }
  ~Workload() { stop(); }
  void stop() {
    stop_ = true;
    if (writer_.joinable()) writer_.join();
    for (auto& t : readers_)
      if (t.joinable()) t.join();
  }

  struct Written {
    std::string path;
    uint64_t seed;
    size_t size;
  };
  std::vector<Written> written() {
    std::lock_guard lock(mu_);
    return written_;
  }
  // Checks every acknowledged file byte for byte; returns the mismatches.
  int verifyAll() {
    int bad = 0;
    for (const auto& w : written()) {
      if (!check(w)) ++bad;
    }
    return bad;
  }
  int failedWrites() const { return failed_writes_; }
  int badReads() const { return bad_reads_; }
  int reads() const { return reads_; }
  std::string firstError() {
    std::lock_guard lock(mu_);
    return first_error_;
  }
  // Longest time one write took (a client-visible stall), in seconds.
  double longestWriteS() const { return longest_write_us_ / 1e6; }

 private:
  void note(const std::string& e) {
    std::lock_guard lock(mu_);
    if (first_error_.empty()) first_error_ = e;
  }
  void writeLoop() {
    std::mt19937_64 rng(7);
    (void)c_.mkdir("/w", 0755, true);
    for (uint64_t i = 0; !stop_; ++i) {
      Written w{"/w/f" + std::to_string(i), rng(), 16384 + rng() % (2 << 20)};
      auto bytes = patternBytes(w.size, w.seed);
      const auto start = std::chrono::steady_clock::now();
      std::unique_ptr<File> f;
      Error e = c_.open(w.path, O_CREAT | O_WRONLY | O_TRUNC, 0644, &f);
      size_t done = 0;
      if (!e) e = f->pwrite(bytes.data(), bytes.size(), 0, &done);
      if (!e) e = f->close();
      const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::steady_clock::now() - start)
                          .count();
      longest_write_us_ = std::max<int64_t>(longest_write_us_, us);
      if (e) {
        ++failed_writes_;
        note(w.path + ": " + e.message);
        continue;
      }
      std::lock_guard lock(mu_);
      written_.push_back(w);
    }
  }
  bool check(const Written& w) {
    std::unique_ptr<File> f;
    Error e = c_.open(w.path, O_RDONLY, 0, &f);
    std::vector<uint8_t> got(w.size + 1);
    size_t done = 0;
    if (!e) e = f->pread(got.data(), got.size(), 0, &done);
    if (e) {
      note("read " + w.path + ": " + e.message);
      return false;
    }
    got.resize(done);
    const auto want = patternBytes(w.size, w.seed);
    if (got != want) {
      size_t first = 0, last = 0, zeros = 0, differ = 0;
      for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
        if (got[i] == want[i]) continue;
        if (differ++ == 0) first = i;
        last = i;
        zeros += got[i] == 0;
      }
      note("read " + w.path + " (inode " + std::to_string(f->ino()) + "): other bytes (" +
           std::to_string(done) + " of " + std::to_string(w.size) + "; " + std::to_string(differ) +
           " differ, from " + std::to_string(first) + " to " + std::to_string(last) + ", " +
           std::to_string(zeros) + " of them zero)");
      if (on_bad) on_bad(f->ino());
      return false;
    }
    return true;
  }
  void readLoop(uint64_t seed) {
    std::mt19937_64 rng(seed);
    while (!stop_) {
      Written w;
      {
        std::lock_guard lock(mu_);
        if (written_.empty()) {
          w.path.clear();
        } else {
          w = written_[rng() % written_.size()];
        }
      }
      if (w.path.empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      if (!check(w)) ++bad_reads_;
      ++reads_;
    }
  }

  Client& c_;

 public:
  // Called with the inode of a file that read other bytes (diagnostics).
  std::function<void(uint64_t ino)> on_bad;

 private:
  std::atomic<bool> stop_{false};
  std::thread writer_;
  std::vector<std::thread> readers_;
  std::mutex mu_;
  std::vector<Written> written_;
  std::string first_error_;
  std::atomic<int> failed_writes_{0}, bad_reads_{0}, reads_{0};
  std::atomic<int64_t> longest_write_us_{0};
};

}  // namespace cistern::testing
