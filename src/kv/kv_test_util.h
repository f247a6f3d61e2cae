// Test helpers: engines for the conformance suite, each in a fresh place.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>

#include "kv/engine.h"
#include "kv/key_codec.h"

namespace cistern::kv {

// A temporary directory removed on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "/cistern-XXXXXX";
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct EngineFactory {
  std::string name;
  // Opens an engine in `dir` (ignored by mem), with `options`.
  std::function<std::unique_ptr<Engine>(const std::string& dir, const EngineOptions&)> open;
  bool durable;
  // Divides the work of the many-commit tests, for engines whose every
  // commit costs network round trips and a disk sync (etcd).
  int scale = 1;
};

// A RocksDB engine factory; `tune` adjusts the options.
inline EngineFactory rocksEngine(std::string name,
                                 std::function<void(RocksEngineOptions*)> tune = {}) {
  return {std::move(name),
          [tune](const std::string& dir, const EngineOptions& o) {
            RocksEngineOptions ro;
            ro.engine = o;
            ro.path = dir + "/db";
            ro.block_cache_bytes = 8 << 20;
            if (tune) tune(&ro);
            auto r = openRocksEngine(ro);
            EXPECT_TRUE(r.ok()) << r.status().toString();
            return std::move(r).value();
          },
          true};
}

inline std::vector<EngineFactory> allEngines() {
  return {
      {"mem", [](const std::string&, const EngineOptions& o) { return openMemEngine(o); }, false},
      rocksEngine("rocksdb"),
      // RocksDB's own WAL instead of the commit log.
      rocksEngine("rocksdb_wal", [](RocksEngineOptions* o) { o->commit_log = false; }),
      // Small log segments, so that tests cross segment reuse and checkpoints.
      rocksEngine("rocksdb_small_log",
                  [](RocksEngineOptions* o) {
                    o->log_segment_bytes = 256 << 10;
                    o->log_segments_max = 3;
                  }),
  };
}

// The engines of the KV's own tests: allEngines() and two whose log writer
// always applies a batch itself, or always hands it to one of its threads
// when others wait (EngineOptions::batch_applier; the default chooses per
// batch, so neither way is certain to run in a short test).
inline std::vector<EngineFactory> kvTestEngines() {
  auto engines = allEngines();
  engines.push_back(rocksEngine("rocksdb_writer_applies", [](RocksEngineOptions* o) {
    o->engine.batch_applier = EngineOptions::BatchApplier::kWriter;
  }));
  engines.push_back(rocksEngine("rocksdb_handoff", [](RocksEngineOptions* o) {
    o->engine.batch_applier = EngineOptions::BatchApplier::kHandoff;
  }));
  return engines;
}

// Rows whose key starts with `prefix` (all of them, in one read).
inline size_t countRows(Engine& engine, Prefix prefix) {
  size_t n = 0;
  std::string begin = KeyWriter(prefix).key();
  Status s = runReadTransaction(engine, [&](ReadTransaction& t) -> Status {
    ASSIGN_OR_RETURN(auto rows, t.getRange(begin, strinc(begin), {}));
    n = rows.kvs.size();
    return Status::OK();
  });
  EXPECT_TRUE(s.ok()) << s.toString();
  return n;
}

}  // namespace cistern::kv
