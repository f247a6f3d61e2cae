// Test helpers: engines for the conformance suite, each in a fresh place.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>

#include "kv/engine.h"

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
};

inline std::vector<EngineFactory> allEngines() {
  return {
      {"mem", [](const std::string&, const EngineOptions& o) { return openMemEngine(o); }, false},
      {"rocksdb",
       [](const std::string& dir, const EngineOptions& o) {
         RocksEngineOptions ro;
         ro.engine = o;
         ro.path = dir + "/db";
         ro.block_cache_bytes = 8 << 20;
         auto r = openRocksEngine(ro);
         EXPECT_TRUE(r.ok()) << r.status().toString();
         return std::move(r).value();
       },
       true},
  };
}

}  // namespace cistern::kv
