// The MetaStore test fixture: a MetaStore on each KV engine with four
// chains registered, callers of every kind, and helpers to look at or damage
// the rows. TEST_P(MetaTest, ...) in any meta test file; meta_store_test.cc
// instantiates MetaTest on every engine.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>

#include "kv/kv_suite_engines.h"
#include "meta/fsck.h"
#include "meta/meta_store.h"
#include "meta/schema.h"

namespace cistern::meta::test_util {

inline Caller who(uint32_t uid, uint32_t gid, std::vector<uint32_t> groups = {}) {
  Caller c;
  c.set_uid(uid);
  c.set_gid(gid);
  for (uint32_t g : groups) c.add_groups(g);
  return c;
}
inline const Caller kRoot = who(0, 0);
inline const Caller kAlice = who(1000, 1000);
inline const Caller kBob = who(1001, 1001);
inline const Caller kCarol = who(1002, 1002, {1000});  // in alice's group

class MetaTest : public ::testing::TestWithParam<kv::EngineFactory> {
 protected:
  void SetUp() override {
    kv::EngineOptions o;
    o.sync_commits = false;  // these tests are about semantics; kv tests cover durability
    engine_ = GetParam().open(dir_.path(), o);
    // Four storage chains, as mgmtd will register them.
    ASSERT_TRUE(kv::runTransaction(*engine_, [](kv::Transaction& t) {
                  for (uint32_t id = 1; id <= 4; ++id) t.set(chainKey(id), "");
                  return Status::OK();
                }).ok());
    store_ = std::make_unique<MetaStore>(*engine_);
    ASSERT_TRUE(store_->init().ok());
  }
  void TearDown() override {
    if (expect_clean_) {
      auto report = fsck(*engine_);
      ASSERT_TRUE(report.ok()) << report.status().toString();
      for (auto& p : report->problems) ADD_FAILURE() << "fsck: " << p;
    }
    store_.reset();
    engine_.reset();
  }

  // A directory under root owned by `owner` with `mode`.
  uint64_t dirOwnedBy(const Caller& owner, uint32_t mode, const std::string& name = "d") {
    auto d = store_->mkdir(kRoot, kRootIno, name, mode);
    EXPECT_TRUE(d.ok()) << d.status().toString();
    // Hand the directory to `owner` (setattr lands with its own operation; write directly).
    Inode n = *d;
    n.set_uid(owner.uid());
    n.set_gid(owner.gid());
    EXPECT_TRUE(kv::runTransaction(*engine_, [&](kv::Transaction& t) {
                  storeInode(t, n);
                  return Status::OK();
                }).ok());
    return n.ino();
  }

  std::set<std::string> names(uint64_t dir) {
    std::set<std::string> out;
    std::string cookie;
    do {
      auto page = store_->readdir(kRoot, dir, cookie, 0);
      EXPECT_TRUE(page.ok()) << page.status().toString();
      for (auto& e : page->entries) EXPECT_TRUE(out.insert(e.name).second) << "twice: " << e.name;
      cookie = page->next_cookie;
    } while (!cookie.empty());
    return out;
  }

  void corrupt(const std::function<void(kv::Transaction&)>& fn) {
    ASSERT_TRUE(kv::runTransaction(*engine_, [&](kv::Transaction& t) {
                  fn(t);
                  return Status::OK();
                }).ok());
  }

  bool expect_clean_ = true;
  kv::TempDir dir_;
  std::unique_ptr<kv::Engine> engine_;
  std::unique_ptr<MetaStore> store_;
};

}  // namespace cistern::meta::test_util
