// bench/run kv — transactions/s of the RocksDB-backed kv::Engine, next to raw
// RocksDB synced writes from the same number of threads in the same run.
//
// Figures (8 threads, synced commits, keys spread so conflicts are rare):
//   kv_txn_1write_per_s        read-write transactions with 1 set
//   kv_txn_10write_per_s       read-write transactions with 10 sets
//   kv_point_read_per_s        read-only transactions with 1 get
//   rocksdb_raw_put_per_s      rocksdb::DB::Put with sync=true (baseline)
//   kv_txn_1write_vs_rocksdb   kv_txn_1write_per_s / rocksdb_raw_put_per_s (x)
//   kv_bench_peak_rss_mib      peak RSS of the process
#include <rocksdb/db.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "common/random.h"
#include "kv/engine.h"

using namespace cistern;

namespace {

constexpr int kThreads = 8;
constexpr uint64_t kKeys = 100'000;

std::string key(uint64_t i) { return "bench/" + std::to_string(i); }

// Runs `op` on kThreads threads (each with its own generator) for `secs`;
// returns ops/s. A failed operation ends the benchmark.
double run(double secs, const std::function<bool(Random&)>& op) {
  std::vector<std::unique_ptr<Xoshiro256>> rngs;
  for (int t = 0; t < kThreads; ++t)
    rngs.push_back(std::make_unique<Xoshiro256>(static_cast<uint64_t>(t) * 7919 + 1));
  std::atomic<bool> failed{false};
  double rate = bench::runTimed(kThreads, secs, [&](int t, uint64_t) {
    if (op(*rngs[static_cast<size_t>(t)])) return true;
    failed = true;
    return false;
  });
  if (failed) {
    std::fprintf(stderr, "kv bench: an operation failed\n");
    std::exit(1);
  }
  return rate;
}

}  // namespace

int main(int argc, char** argv) {
  double secs = argc > 1 ? std::atof(argv[1]) : 3.0;
  std::string dir =
      std::filesystem::absolute("build/bench-kv-" + std::to_string(getpid())).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);

  double txn1, txn10, reads, raw;
  {
    kv::RocksEngineOptions o;
    o.path = dir + "/engine";
    auto engine = kv::openRocksEngine(o);
    if (!engine.ok()) {
      std::fprintf(stderr, "kv bench: %s\n", engine.status().toString().c_str());
      return 1;
    }
    kv::Engine& e = **engine;
    // Preload the keys the readers look up.
    for (uint64_t b = 0; b < kKeys; b += 1000) {
      auto t = e.begin();
      for (uint64_t i = b; i < b + 1000; ++i) t->set(key(i), std::string(100, 'v'));
      if (!t->commit().ok()) return 1;
    }
    kv::RetryOptions retry{.attempts_max = 1000};
    txn1 = run(secs, [&](Random& rng) {
      return kv::runTransaction(
                 e,
                 [&](kv::Transaction& t) {
                   t.set(key(rng.uniform(kKeys)), std::string(100, 'w'));
                   return Status::OK();
                 },
                 retry)
          .ok();
    });
    txn10 = run(secs, [&](Random& rng) {
      return kv::runTransaction(
                 e,
                 [&](kv::Transaction& t) {
                   for (int i = 0; i < 10; ++i)
                     t.set(key(rng.uniform(kKeys)), std::string(100, 'x'));
                   return Status::OK();
                 },
                 retry)
          .ok();
    });
    reads = run(secs, [&](Random& rng) {
      auto t = e.beginRead();
      auto v = t->get(key(rng.uniform(kKeys)));
      return v.ok() && v->has_value();
    });
  }
  {
    rocksdb::Options o;
    o.create_if_missing = true;
    rocksdb::DB* raw_db = nullptr;
    if (!rocksdb::DB::Open(o, dir + "/raw", &raw_db).ok()) return 1;
    std::unique_ptr<rocksdb::DB> db(raw_db);
    rocksdb::WriteOptions wo;
    wo.sync = true;
    std::string value(100, 'w');
    raw = run(secs, [&](Random& rng) { return db->Put(wo, key(rng.uniform(kKeys)), value).ok(); });
  }
  std::filesystem::remove_all(dir);

  std::printf(
      "kv (rocksdb, %d threads, synced): %.0f txn/s (1 write), %.0f txn/s (10 writes), "
      "%.0f reads/s; raw rocksdb synced puts %.0f/s\n",
      kThreads, txn1, txn10, reads, raw);
  bench::figure("kv_txn_1write_per_s", txn1, "txn/s");
  bench::figure("kv_txn_10write_per_s", txn10, "txn/s");
  bench::figure("kv_point_read_per_s", reads, "txn/s");
  bench::figure("rocksdb_raw_put_per_s", raw, "ops/s");
  bench::figure("kv_bench_peak_rss_mib", bench::peakRssMiB(), "MiB");
  bench::figure("kv_txn_1write_vs_rocksdb", txn1 / raw, "x");
  return 0;
}
