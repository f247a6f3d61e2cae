// Child process for kv_crash_test: commits transactions in a loop until it is
// killed. Transaction i writes `txn/<i>/<j>` for j < 10 and then reports i on
// stdout once commit() returned ok, so the parent knows which are acknowledged.
//
//   kv_crash_child DB_DIR FIRST_TXN [THREADS [PIPELINE_DEPTH SEGMENT_KIB]]
//
// With THREADS > 1, thread t commits FIRST_TXN + t, + t + THREADS, ...
// With KV_CRASH_LAZY=1 in the environment, transactions commit with
// Durability::kLazy except every tenth (kSynced): a process crash must keep
// them all the same.
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kv/engine.h"

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4 && argc != 6) {
    std::fprintf(stderr,
                 "usage: kv_crash_child DB_DIR FIRST_TXN [THREADS [APPLIER SEGMENT_KIB]]\n"
                 "  APPLIER: auto, writer or handoff (who applies a logged batch)\n");
    return 2;
  }
  cistern::kv::RocksEngineOptions o;
  o.path = argv[1];
  o.block_cache_bytes = 8 << 20;
  int threads = argc >= 4 ? std::atoi(argv[3]) : 1;
  if (argc == 6) {
    const std::string applier = argv[4];
    o.engine.batch_applier = applier == "writer" ? cistern::kv::EngineOptions::BatchApplier::kWriter
                             : applier == "handoff"
                                 ? cistern::kv::EngineOptions::BatchApplier::kHandoff
                                 : cistern::kv::EngineOptions::BatchApplier::kAuto;
    o.log_segment_bytes = static_cast<uint64_t>(std::atol(argv[5])) << 10;
    o.log_segments_max = 3;
    o.write_buffer_bytes = 1 << 20;  // RocksDB flushes on its own as well
  }
  auto engine = cistern::kv::openRocksEngine(o);
  if (!engine.ok()) {
    std::fprintf(stderr, "open: %s\n", engine.status().toString().c_str());
    return 1;
  }
  const char* lazy_env = std::getenv("KV_CRASH_LAZY");
  const bool lazy = lazy_env && std::string(lazy_env) == "1";
  long first = std::atol(argv[2]);
  std::mutex out_mu;
  auto run = [&](long start) {
    for (long i = start;; i += threads) {
      auto t = (*engine)->begin();
      std::string payload(1000 + (i % 7) * 500, static_cast<char>('a' + i % 26));
      for (int j = 0; j < 10; ++j)
        t->set("txn/" + std::to_string(i) + "/" + std::to_string(j), payload);
      if (threads == 1) t->set("last", std::to_string(i));
      t->atomicAdd("count", 1);
      if (lazy && i % 10 != 0) t->setDurability(cistern::kv::Durability::kLazy);
      cistern::Status s = t->commit();
      if (!s.ok()) {
        std::fprintf(stderr, "commit: %s\n", s.toString().c_str());
        std::exit(1);
      }
      std::lock_guard lock(out_mu);
      std::printf("%ld\n", i);
      std::fflush(stdout);
    }
  };
  std::vector<std::thread> ts;
  for (int t = 1; t < threads; ++t) ts.emplace_back(run, first + t);
  run(first);
}
