// Child process for kv_crash_test: commits transactions in a loop until it is
// killed. Transaction i writes `txn/<i>/<j>` for j < 10 and then reports i on
// stdout once commit() returned ok, so the parent knows which are acknowledged.
//
//   kv_crash_child DB_DIR FIRST_TXN
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kv/engine.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: kv_crash_child DB_DIR FIRST_TXN\n");
    return 2;
  }
  cistern::kv::RocksEngineOptions o;
  o.path = argv[1];
  o.block_cache_bytes = 8 << 20;
  auto engine = cistern::kv::openRocksEngine(o);
  if (!engine.ok()) {
    std::fprintf(stderr, "open: %s\n", engine.status().toString().c_str());
    return 1;
  }
  for (long i = std::atol(argv[2]);; ++i) {
    auto t = (*engine)->begin();
    std::string payload(1000 + (i % 7) * 500, static_cast<char>('a' + i % 26));
    for (int j = 0; j < 10; ++j)
      t->set("txn/" + std::to_string(i) + "/" + std::to_string(j), payload);
    t->set("last", std::to_string(i));
    cistern::Status s = t->commit();
    if (!s.ok()) {
      std::fprintf(stderr, "commit: %s\n", s.toString().c_str());
      return 1;
    }
    std::printf("%ld\n", i);
    std::fflush(stdout);
  }
}
