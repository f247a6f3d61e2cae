// MetaStore behaviour on every KV engine: each operation's success and error
// cases with their errno, a permission matrix, concurrency, and replays.
#include "meta/meta_store.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "common/random.h"
#include "kv/key_codec.h"
#include "kv/kv_test_util.h"
#include "meta/fsck.h"
#include "meta/gc_worker.h"
#include "meta/record_expiry.h"
#include "meta/schema.h"

namespace cistern::meta {
namespace {

Caller who(uint32_t uid, uint32_t gid, std::vector<uint32_t> groups = {}) {
  Caller c;
  c.set_uid(uid);
  c.set_gid(gid);
  for (uint32_t g : groups) c.add_groups(g);
  return c;
}
const Caller kRoot = who(0, 0);
const Caller kAlice = who(1000, 1000);
const Caller kBob = who(1001, 1001);
const Caller kCarol = who(1002, 1002, {1000});  // in alice's group

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

TEST_P(MetaTest, InitCreatesTheRootOnce) {
  auto root = store_->getattr(kRootIno);
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->type(), DIRECTORY);
  EXPECT_EQ(root->mode(), 0755u);
  EXPECT_EQ(root->parent(), kRootIno);
  ASSERT_TRUE(store_->mkdir(kRoot, kRootIno, "keep", 0755).ok());
  ASSERT_TRUE(store_->init().ok());
  EXPECT_TRUE(store_->lookup(kRoot, kRootIno, "keep").ok());
}

TEST_P(MetaTest, MkdirThenLookupAndGetattr) {
  auto d = store_->mkdir(kAlice, kRootIno, "x", 0755);
  EXPECT_EQ(d.code(), ErrorCode::kPermissionDenied);  // root dir is 0755 root:root
  d = store_->mkdir(kRoot, kRootIno, "x", 040755);    // type bits are dropped
  ASSERT_TRUE(d.ok()) << d.status().toString();
  EXPECT_EQ(d->mode(), 0755u);
  EXPECT_GE(d->ino(), kFirstAllocatedIno);
  auto l = store_->lookup(kAlice, kRootIno, "x");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->ino(), d->ino());
  EXPECT_EQ(store_->lookup(kAlice, d->ino(), "..")->ino(), kRootIno);
  EXPECT_EQ(store_->lookup(kAlice, d->ino(), ".")->ino(), d->ino());
  EXPECT_EQ(store_->mkdir(kRoot, kRootIno, "x", 0755).code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(store_->getattr(999999).code(), ErrorCode::kNotFound);
}

TEST_P(MetaTest, NamesAreChecked) {
  EXPECT_EQ(store_->mkdir(kRoot, kRootIno, "", 0755).code(), ErrorCode::kNotFound);
  EXPECT_EQ(store_->mkdir(kRoot, kRootIno, std::string(256, 'n'), 0755).code(),
            ErrorCode::kNameTooLong);
  EXPECT_TRUE(store_->mkdir(kRoot, kRootIno, std::string(255, 'n'), 0755).ok());
  EXPECT_EQ(store_->mkdir(kRoot, kRootIno, "a/b", 0755).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(store_->create(kRoot, kRootIno, std::string("a\0b", 3), 0644, true).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(store_->mkdir(kRoot, kRootIno, ".", 0755).code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(store_->mkdir(kRoot, kRootIno, "..", 0755).code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(store_->lookup(kRoot, kRootIno, "").code(), ErrorCode::kNotFound);
}

TEST_P(MetaTest, CreateFixesTheLayoutAndHonoursExclusive) {
  auto f = store_->create(kRoot, kRootIno, "f", 0644, true);
  ASSERT_TRUE(f.ok()) << f.status().toString();
  EXPECT_EQ(f->type(), REGULAR);
  EXPECT_EQ(f->layout().chunk_size(), 1u << 20);
  EXPECT_EQ(f->layout().stripe_width(), 4u);
  ASSERT_EQ(f->layout().chains_size(), 4);
  std::set<uint32_t> chains(f->layout().chains().begin(), f->layout().chains().end());
  EXPECT_EQ(chains, (std::set<uint32_t>{1, 2, 3, 4}));
  EXPECT_EQ(f->layout().chains(0), 1 + f->ino() % 4);
  EXPECT_EQ(store_->create(kRoot, kRootIno, "f", 0644, true).code(), ErrorCode::kAlreadyExists);
  auto again = store_->create(kRoot, kRootIno, "f", 0600, false);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->ino(), f->ino());
  EXPECT_EQ(again->mode(), 0644u);
  ASSERT_TRUE(store_->mkdir(kRoot, kRootIno, "d", 0755).ok());
  EXPECT_EQ(store_->create(kRoot, kRootIno, "d", 0644, false).code(), ErrorCode::kIsDirectory);
  auto nf = store_->create(kRoot, f->ino(), "x", 0644, true);
  EXPECT_EQ(nf.code(), ErrorCode::kNotDirectory);
}

TEST_P(MetaTest, DirectoryLayoutIsInherited) {
  auto d = store_->mkdir(kRoot, kRootIno, "ckpt", 0755);
  ASSERT_TRUE(d.ok());
  Inode n = *d;
  n.mutable_dir_layout()->set_chunk_size(4u << 20);
  n.mutable_dir_layout()->set_stripe_width(2);
  ASSERT_TRUE(kv::runTransaction(*engine_, [&](kv::Transaction& t) {
                storeInode(t, n);
                return Status::OK();
              }).ok());
  auto sub = store_->mkdir(kRoot, n.ino(), "sub", 0755);
  ASSERT_TRUE(sub.ok());
  auto f = store_->create(kRoot, sub->ino(), "shard", 0644, true);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->layout().chunk_size(), 4u << 20);
  EXPECT_EQ(f->layout().stripe_width(), 2u);
  EXPECT_EQ(f->layout().chains_size(), 2);
}

TEST_P(MetaTest, CreateWithoutChainsFailsClearly) {
  ASSERT_TRUE(kv::runTransaction(*engine_, [](kv::Transaction& t) {
                t.clearRange(chainBegin(), chainEnd());
                return Status::OK();
              }).ok());
  auto f = store_->create(kRoot, kRootIno, "f", 0644, true);
  EXPECT_EQ(f.code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(store_->lookup(kRoot, kRootIno, "f").code(), ErrorCode::kNotFound);
}

TEST_P(MetaTest, UnlinkRemovesFilesAndQueuesTheirChunks) {
  auto f = store_->create(kRoot, kRootIno, "f", 0644, true);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(store_->mkdir(kRoot, kRootIno, "d", 0755).ok());
  EXPECT_EQ(store_->unlink(kRoot, kRootIno, "d").code(), ErrorCode::kIsDirectory);
  EXPECT_EQ(store_->unlink(kRoot, kRootIno, "missing").code(), ErrorCode::kNotFound);
  EXPECT_EQ(store_->unlink(kRoot, kRootIno, ".").code(), ErrorCode::kIsDirectory);
  EXPECT_EQ(store_->unlink(kAlice, kRootIno, "f").code(), ErrorCode::kPermissionDenied);
  ASSERT_TRUE(store_->unlink(kRoot, kRootIno, "f").ok());
  EXPECT_EQ(store_->lookup(kRoot, kRootIno, "f").code(), ErrorCode::kNotFound);
  EXPECT_EQ(store_->getattr(f->ino()).code(), ErrorCode::kNotFound);
  auto t = engine_->beginRead();
  auto gc = t->getRange(gcBegin(), gcEnd());
  ASSERT_TRUE(gc.ok());
  ASSERT_EQ(gc->kvs.size(), 1u);
  GcEntry queued;
  ASSERT_TRUE(queued.ParseFromString(gc->kvs[0].value));
  EXPECT_TRUE(queued.whole_file());
  EXPECT_EQ(queued.layout().chains_size(), 4);
}

TEST_P(MetaTest, RmdirRemovesOnlyEmptyDirectories) {
  auto d = store_->mkdir(kRoot, kRootIno, "d", 0755);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(store_->create(kRoot, d->ino(), "f", 0644, true).ok());
  ASSERT_TRUE(store_->create(kRoot, kRootIno, "file", 0644, true).ok());
  EXPECT_EQ(store_->rmdir(kRoot, kRootIno, "d").code(), ErrorCode::kNotEmpty);
  EXPECT_EQ(store_->rmdir(kRoot, kRootIno, "file").code(), ErrorCode::kNotDirectory);
  EXPECT_EQ(store_->rmdir(kRoot, kRootIno, "nope").code(), ErrorCode::kNotFound);
  EXPECT_EQ(store_->rmdir(kRoot, d->ino(), ".").code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(store_->rmdir(kRoot, d->ino(), "..").code(), ErrorCode::kNotEmpty);
  ASSERT_TRUE(store_->unlink(kRoot, d->ino(), "f").ok());
  ASSERT_TRUE(store_->rmdir(kRoot, kRootIno, "d").ok());
  EXPECT_EQ(store_->getattr(d->ino()).code(), ErrorCode::kNotFound);
  EXPECT_EQ(store_->create(kRoot, d->ino(), "late", 0644, true).code(), ErrorCode::kNotFound);
}

TEST_P(MetaTest, RenameMovesReplacesAndRefuses) {
  auto a = store_->mkdir(kRoot, kRootIno, "a", 0755);
  auto b = store_->mkdir(kRoot, kRootIno, "b", 0755);
  auto f = store_->create(kRoot, a->ino(), "f", 0644, true);
  auto g = store_->create(kRoot, b->ino(), "g", 0644, true);
  ASSERT_TRUE(a.ok() && b.ok() && f.ok() && g.ok());
  // plain move across directories
  ASSERT_TRUE(store_->rename(kRoot, a->ino(), "f", b->ino(), "f2").ok());
  EXPECT_EQ(store_->lookup(kRoot, a->ino(), "f").code(), ErrorCode::kNotFound);
  EXPECT_EQ(store_->lookup(kRoot, b->ino(), "f2")->ino(), f->ino());
  // over an existing file: the old file goes away
  ASSERT_TRUE(store_->rename(kRoot, b->ino(), "f2", b->ino(), "g").ok());
  EXPECT_EQ(store_->lookup(kRoot, b->ino(), "g")->ino(), f->ino());
  EXPECT_EQ(store_->getattr(g->ino()).code(), ErrorCode::kNotFound);
  // onto itself: nothing happens
  EXPECT_TRUE(store_->rename(kRoot, b->ino(), "g", b->ino(), "g").ok());
  // NOREPLACE
  ASSERT_TRUE(store_->create(kRoot, b->ino(), "h", 0644, true).ok());
  EXPECT_EQ(store_->rename(kRoot, b->ino(), "g", b->ino(), "h", kRenameNoReplace).code(),
            ErrorCode::kAlreadyExists);
  // EXCHANGE
  auto h = store_->lookup(kRoot, b->ino(), "h");
  ASSERT_TRUE(store_->rename(kRoot, b->ino(), "g", b->ino(), "h", kRenameExchange).ok());
  EXPECT_EQ(store_->lookup(kRoot, b->ino(), "g")->ino(), h->ino());
  EXPECT_EQ(store_->lookup(kRoot, b->ino(), "h")->ino(), f->ino());
  EXPECT_EQ(store_->rename(kRoot, b->ino(), "g", b->ino(), "nope", kRenameExchange).code(),
            ErrorCode::kNotFound);
  EXPECT_EQ(store_->rename(kRoot, b->ino(), "g", b->ino(), "h", kRenameExchange | kRenameNoReplace)
                .code(),
            ErrorCode::kInvalidArgument);
  // directories: over an empty one, not over a non-empty one, not onto a file, not into itself
  auto e = store_->mkdir(kRoot, kRootIno, "empty", 0755);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(store_->rename(kRoot, kRootIno, "a", kRootIno, "b").code(), ErrorCode::kNotEmpty);
  EXPECT_EQ(store_->rename(kRoot, kRootIno, "a", b->ino(), "g").code(), ErrorCode::kNotDirectory);
  EXPECT_EQ(store_->rename(kRoot, b->ino(), "g", kRootIno, "a").code(), ErrorCode::kIsDirectory);
  ASSERT_TRUE(store_->rename(kRoot, kRootIno, "a", kRootIno, "empty").ok());
  EXPECT_EQ(store_->getattr(e->ino()).code(), ErrorCode::kNotFound);
  auto inner = store_->mkdir(kRoot, a->ino(), "inner", 0755);
  ASSERT_TRUE(inner.ok());
  EXPECT_EQ(store_->rename(kRoot, kRootIno, "empty", inner->ino(), "loop").code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(store_->rename(kRoot, kRootIno, "empty", a->ino(), "self").code(),
            ErrorCode::kInvalidArgument);
  // a moved directory's ".." follows it
  ASSERT_TRUE(store_->rename(kRoot, a->ino(), "inner", b->ino(), "inner").ok());
  EXPECT_EQ(store_->lookup(kRoot, inner->ino(), "..")->ino(), b->ino());
  EXPECT_EQ(store_->rename(kRoot, kRootIno, ".", kRootIno, "x").code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(store_->rename(kRoot, kRootIno, "missing", kRootIno, "x").code(), ErrorCode::kNotFound);
}

// Expected outcome of an access with `mask` by `c` on a directory owned by
// alice:alice with `mode`, computed the way POSIX describes it.
bool allowed(const Caller& c, uint32_t mode, int mask) {
  if (c.uid() == 0) return true;
  uint32_t bits = c.uid() == 1000                            ? (mode >> 6) & 7
                  : (c.gid() == 1000 || c.groups_size() > 0) ? (mode >> 3) & 7
                                                             : mode & 7;
  return (bits & static_cast<uint32_t>(mask)) == static_cast<uint32_t>(mask);
}

TEST_P(MetaTest, PermissionMatrix) {
  const std::vector<Caller> callers = {kRoot, kAlice, kCarol, kBob};
  int checked = 0;
  for (uint32_t mode : {0700u, 0750u, 0755u, 0770u, 0777u, 0711u, 0300u, 0500u, 0070u, 0007u}) {
    std::string name = "d" + std::to_string(mode);
    uint64_t d = dirOwnedBy(kAlice, mode, name);
    ASSERT_TRUE(store_->create(kRoot, d, "present", 0644, true).ok());
    for (const Caller& c : callers) {
      std::string tag = "mode " + std::to_string(mode) + " uid " + std::to_string(c.uid());
      // lookup needs x
      EXPECT_EQ(store_->lookup(c, d, "present").ok(), allowed(c, mode, 1)) << tag;
      // readdir needs r
      EXPECT_EQ(store_->readdir(c, d, "", 0).ok(), allowed(c, mode, 4)) << tag;
      // create needs w and x
      auto f = store_->create(c, d, "new" + std::to_string(c.uid()), 0644, true);
      EXPECT_EQ(f.ok(), allowed(c, mode, 3)) << tag << " " << f.status().toString();
      if (!f.ok()) {
        EXPECT_EQ(f.code(), ErrorCode::kPermissionDenied) << tag;
        EXPECT_EQ(f.status().toErrno(), EACCES);
      }
      checked += 3;
    }
  }
  EXPECT_EQ(checked, 120);
}

TEST_P(MetaTest, StickyDirectoryProtectsOthersEntries) {
  uint64_t tmp = dirOwnedBy(kRoot, 01777, "tmp");
  ASSERT_TRUE(store_->create(kAlice, tmp, "alices", 0644, true).ok());
  ASSERT_TRUE(store_->create(kBob, tmp, "bobs", 0644, true).ok());
  EXPECT_EQ(store_->unlink(kBob, tmp, "alices").code(), ErrorCode::kNotPermitted);
  EXPECT_EQ(store_->rename(kBob, tmp, "alices", tmp, "stolen").code(), ErrorCode::kNotPermitted);
  EXPECT_TRUE(store_->unlink(kAlice, tmp, "alices").ok());
  EXPECT_TRUE(store_->unlink(kRoot, tmp, "bobs").ok());
}

TEST_P(MetaTest, SetgidDirectoryPassesItsGroupOn) {
  uint64_t shared = dirOwnedBy(kAlice, 02775, "shared");
  auto f = store_->create(kCarol, shared, "f", 0664, true);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->gid(), 1000u);
  auto d = store_->mkdir(kCarol, shared, "sub", 0755);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->gid(), 1000u);
  EXPECT_TRUE(d->mode() & 02000);
}

TEST_P(MetaTest, ReaddirPagesInNameOrderWithPlus) {
  auto d = store_->mkdir(kRoot, kRootIno, "big", 0755);
  ASSERT_TRUE(d.ok());
  std::set<std::string> want;
  for (int i = 0; i < 450; ++i) {
    std::string n = "file" + std::to_string(i);
    ASSERT_TRUE(store_->create(kRoot, d->ino(), n, 0644, true).ok());
    want.insert(n);
  }
  std::vector<std::string> got;
  std::string cookie;
  int pages = 0;
  do {
    auto page = store_->readdir(kRoot, d->ino(), cookie, 100, /*plus=*/true);
    ASSERT_TRUE(page.ok());
    for (auto& e : page->entries) {
      got.push_back(e.name);
      EXPECT_EQ(e.inode.ino(), e.entry.ino());
      EXPECT_EQ(e.inode.type(), REGULAR);
    }
    cookie = page->next_cookie;
    ++pages;
  } while (!cookie.empty());
  EXPECT_EQ(pages, 5);
  EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
  EXPECT_EQ(std::set<std::string>(got.begin(), got.end()), want);
  EXPECT_EQ(got.size(), want.size());
  auto file = store_->lookup(kRoot, d->ino(), "file1");
  EXPECT_EQ(store_->readdir(kRoot, file->ino(), "", 0).code(), ErrorCode::kNotDirectory);
}

TEST_P(MetaTest, EightThreadsCreateTenThousandNamesInOneDirectory) {
  auto d = store_->mkdir(kRoot, kRootIno, "hot", 0777);
  ASSERT_TRUE(d.ok());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 1250; ++i) {
        auto f = store_->create(kAlice, d->ino(), "t" + std::to_string(t) + "-" + std::to_string(i),
                                0644, true);
        if (!f.ok()) failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  auto all = names(d->ino());
  EXPECT_EQ(all.size(), 10000u);
}

TEST_P(MetaTest, ConcurrentRenamesBetweenTwoDirectoriesLoseNothing) {
  auto a = store_->mkdir(kRoot, kRootIno, "a", 0777);
  auto b = store_->mkdir(kRoot, kRootIno, "b", 0777);
  ASSERT_TRUE(a.ok() && b.ok());
  constexpr int kFiles = 50;
  for (int i = 0; i < kFiles; ++i)
    ASSERT_TRUE(store_->create(kRoot, a->ino(), "f" + std::to_string(i), 0644, true).ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Xoshiro256 rng(t);
      for (int i = 0; i < 300; ++i) {
        std::string n = "f" + std::to_string(rng.uniform(kFiles));
        bool ab = rng.oneIn(2);
        Status s = store_->rename(kRoot, ab ? a->ino() : b->ino(), n, ab ? b->ino() : a->ino(), n);
        if (!s.ok() && s.code() != ErrorCode::kNotFound) ADD_FAILURE() << s.toString();
      }
    });
  }
  for (auto& th : threads) th.join();
  auto in_a = names(a->ino()), in_b = names(b->ino());
  EXPECT_EQ(in_a.size() + in_b.size(), static_cast<size_t>(kFiles));
  for (auto& n : in_a) EXPECT_EQ(in_b.count(n), 0u) << n << " in both";
}

TEST_P(MetaTest, ReaddirPagingWhileOthersInsertAndDelete) {
  auto d = store_->mkdir(kRoot, kRootIno, "churn", 0777);
  ASSERT_TRUE(d.ok());
  std::set<std::string> stable;
  for (int i = 0; i < 300; i += 2) {
    std::string n = "s" + std::to_string(1000 + i);
    stable.insert(n);
    ASSERT_TRUE(store_->create(kRoot, d->ino(), n, 0644, true).ok());
  }
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    Xoshiro256 rng(9);
    while (!stop) {
      std::string n = "s" + std::to_string(1001 + 2 * rng.uniform(150));  // odd: never stable
      if (rng.oneIn(2))
        (void)store_->create(kRoot, d->ino(), n, 0644, false);
      else
        (void)store_->unlink(kRoot, d->ino(), n);
    }
  });
  for (int round = 0; round < 5; ++round) {
    std::set<std::string> seen;
    std::string cookie;
    do {
      auto page = store_->readdir(kRoot, d->ino(), cookie, 7);
      ASSERT_TRUE(page.ok());
      for (auto& e : page->entries)
        EXPECT_TRUE(seen.insert(e.name).second) << "returned twice: " << e.name;
      cookie = page->next_cookie;
    } while (!cookie.empty());
    for (auto& n : stable) EXPECT_TRUE(seen.count(n)) << "missing " << n;
  }
  stop = true;
  churn.join();
}

TEST_P(MetaTest, ReplayedMutationsReturnTheFirstResult) {
  RequestId rid{"client-a", 1};
  auto first = store_->create(kRoot, kRootIno, "f", 0644, true, rid);
  ASSERT_TRUE(first.ok());
  auto replay = store_->create(kRoot, kRootIno, "f", 0644, true, rid);  // lost reply, same request
  ASSERT_TRUE(replay.ok()) << replay.status().toString();
  EXPECT_EQ(replay->ino(), first->ino());
  // A new request for the same name is a different create.
  EXPECT_EQ(store_->create(kRoot, kRootIno, "f", 0644, true, {"client-a", 2}).code(),
            ErrorCode::kAlreadyExists);
  RequestId del{"client-a", 3};
  ASSERT_TRUE(store_->unlink(kRoot, kRootIno, "f", del).ok());
  EXPECT_TRUE(store_->unlink(kRoot, kRootIno, "f", del).ok());  // not ENOENT
  EXPECT_EQ(store_->unlink(kRoot, kRootIno, "f", {"client-a", 4}).code(), ErrorCode::kNotFound);
  RequestId mk{"client-b", 1};
  auto d1 = store_->mkdir(kRoot, kRootIno, "d", 0755, mk);
  auto d2 = store_->mkdir(kRoot, kRootIno, "d", 0755, mk);
  ASSERT_TRUE(d1.ok() && d2.ok());
  EXPECT_EQ(d1->ino(), d2->ino());
  RequestId mv{"client-b", 2};
  ASSERT_TRUE(store_->rename(kRoot, kRootIno, "d", kRootIno, "e", 0, mv).ok());
  EXPECT_TRUE(store_->rename(kRoot, kRootIno, "d", kRootIno, "e", 0, mv).ok());
  EXPECT_EQ(store_->lookup(kRoot, kRootIno, "e")->ino(), d1->ino());
}

TEST_P(MetaTest, InodeNumbersAreUniqueAcrossMetaServers) {
  MetaStore other(*engine_);
  std::set<uint64_t> seen;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      MetaStore& s = t % 2 ? other : *store_;
      for (int i = 0; i < 3000; ++i) {
        auto ino = s.allocator().next();
        ASSERT_TRUE(ino.ok());
        std::lock_guard lock(mu);
        ASSERT_TRUE(seen.insert(*ino).second) << *ino;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(seen.size(), 12000u);
}

TEST_P(MetaTest, StatfsCountsInodesAndReportsCapacity) {
  auto before = store_->statfs();
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(before->inodes_used, 1u);  // the root
  EXPECT_FALSE(before->capacity_known);
  EXPECT_EQ(before->name_max, 255u);
  auto d = store_->mkdir(kRoot, kRootIno, "d", 0755);
  ASSERT_TRUE(store_->create(kRoot, d->ino(), "f", 0644, true).ok());
  ASSERT_TRUE(store_->symlink(kRoot, d->ino(), "l", "f").ok());
  EXPECT_EQ(store_->statfs()->inodes_used, 4u);
  ASSERT_TRUE(store_->unlink(kRoot, d->ino(), "f").ok());
  ASSERT_TRUE(store_->unlink(kRoot, d->ino(), "l").ok());
  ASSERT_TRUE(store_->rmdir(kRoot, kRootIno, "d").ok());
  EXPECT_EQ(store_->statfs()->inodes_used, 1u);
  store_->setCapacitySource([]() -> Result<std::pair<uint64_t, uint64_t>> {
    return std::pair<uint64_t, uint64_t>(1000, 400);
  });
  auto st = store_->statfs();
  EXPECT_TRUE(st->capacity_known);
  EXPECT_EQ(st->bytes_total, 1000u);
  EXPECT_EQ(st->bytes_free, 400u);
  store_->setCapacitySource([]() -> Result<std::pair<uint64_t, uint64_t>> {
    return Status(ErrorCode::kConnectionFailed, "storage unreachable");
  });
  EXPECT_EQ(store_->statfs().code(), ErrorCode::kConnectionFailed);
}

TEST_P(MetaTest, ChmodAndChownFollowPosixRules) {
  uint64_t d = dirOwnedBy(kAlice, 0777, "home");
  auto f = store_->create(kAlice, d, "f", 0644, true);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(store_->setattr(kBob, f->ino(), {.mode = 0777}).code(), ErrorCode::kNotPermitted);
  auto m = store_->setattr(kAlice, f->ino(), {.mode = 0100600});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->mode(), 0600u);
  EXPECT_GE(m->ctime_ns(), f->ctime_ns());
  // Only root gives a file away; the owner may change the group to one of its own.
  EXPECT_EQ(store_->setattr(kAlice, f->ino(), {.uid = 1001}).code(), ErrorCode::kNotPermitted);
  EXPECT_EQ(store_->setattr(kAlice, f->ino(), {.gid = 1001}).code(), ErrorCode::kNotPermitted);
  Caller alice_in_1001 = who(1000, 1000, {1001});
  EXPECT_EQ(store_->setattr(alice_in_1001, f->ino(), {.gid = 1001})->gid(), 1001u);
  ASSERT_TRUE(store_->setattr(kRoot, f->ino(), {.mode = 06755}).ok());
  auto owned = store_->setattr(kRoot, f->ino(), {.uid = 1001, .gid = 1001});
  ASSERT_TRUE(owned.ok());
  EXPECT_EQ(owned->uid(), 1001u);
  EXPECT_EQ(owned->mode(), 0755u);  // chown drops set-ID bits
  // A non-member cannot set the set-group-ID bit.
  auto g = store_->create(kAlice, d, "g", 0644, true);
  EXPECT_EQ(store_->setattr(kAlice, g->ino(), {.mode = 02755, .gid = 1000})->mode(), 02755u);
  ASSERT_TRUE(store_->setattr(kRoot, g->ino(), {.gid = 5}).ok());
  EXPECT_EQ(store_->setattr(kAlice, g->ino(), {.mode = 02755})->mode(), 0755u);
  EXPECT_EQ(store_->setattr(kRoot, 999999, {.mode = 0}).code(), ErrorCode::kNotFound);
}

TEST_P(MetaTest, TruncateNeedsWriteAndQueuesNothing) {
  auto f = store_->create(kRoot, kRootIno, "f", 0644, true);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(store_->setattr(kAlice, f->ino(), {.size = 10}).code(), ErrorCode::kPermissionDenied);
  auto grown = store_->setattr(kRoot, f->ino(), {.size = 5u << 20});
  ASSERT_TRUE(grown.ok());
  EXPECT_EQ(grown->size(), 5u << 20);
  auto shrunk = store_->setattr(kRoot, f->ino(), {.size = (1u << 20) + 1});
  ASSERT_TRUE(shrunk.ok());
  EXPECT_EQ(shrunk->size(), (1u << 20) + 1);
  // The client cut the chunks past the new end before this commit: no GC entry.
  auto t = engine_->beginRead();
  auto gc = t->getRange(gcBegin(), gcEnd());
  ASSERT_TRUE(gc.ok());
  EXPECT_TRUE(gc->kvs.empty());
  auto d = store_->mkdir(kRoot, kRootIno, "d", 0755);
  EXPECT_EQ(store_->setattr(kRoot, d->ino(), {.size = 0}).code(), ErrorCode::kIsDirectory);
}

TEST_P(MetaTest, UtimensNeedsOwnershipForExplicitTimesAndWriteForNow) {
  uint64_t d = dirOwnedBy(kAlice, 0777, "times");
  auto f = store_->create(kAlice, d, "f", 0666, true);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(store_->setattr(kBob, f->ino(), {.mtime_ns = 42}).code(), ErrorCode::kNotPermitted);
  EXPECT_TRUE(store_->setattr(kBob, f->ino(), {.mtime_now = true}).ok());  // world-writable
  auto set = store_->setattr(kAlice, f->ino(), {.atime_ns = 7, .mtime_ns = 42});
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(set->atime_ns(), 7);
  EXPECT_EQ(set->mtime_ns(), 42);
  ASSERT_TRUE(store_->setattr(kAlice, f->ino(), {.mode = 0644}).ok());
  EXPECT_EQ(store_->setattr(kBob, f->ino(), {.mtime_now = true}).code(),
            ErrorCode::kPermissionDenied);
}

TEST_P(MetaTest, HardLinksShareTheInode) {
  auto f = store_->create(kRoot, kRootIno, "f", 0644, true);
  auto d = store_->mkdir(kRoot, kRootIno, "d", 0755);
  ASSERT_TRUE(f.ok() && d.ok());
  auto l = store_->link(kRoot, f->ino(), d->ino(), "g");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->nlink(), 2u);
  EXPECT_EQ(store_->lookup(kRoot, d->ino(), "g")->ino(), f->ino());
  EXPECT_EQ(store_->link(kRoot, f->ino(), d->ino(), "g").code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(store_->link(kRoot, d->ino(), kRootIno, "dirlink").code(), ErrorCode::kNotPermitted);
  EXPECT_EQ(store_->link(kAlice, f->ino(), d->ino(), "h").code(), ErrorCode::kPermissionDenied);
  ASSERT_TRUE(store_->unlink(kRoot, kRootIno, "f").ok());
  auto still = store_->getattr(f->ino());
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->nlink(), 1u);
  ASSERT_TRUE(store_->unlink(kRoot, d->ino(), "g").ok());
  EXPECT_EQ(store_->getattr(f->ino()).code(), ErrorCode::kNotFound);
}

TEST_P(MetaTest, SymlinksStoreTheirTarget) {
  auto s = store_->symlink(kRoot, kRootIno, "ln", "../some/where");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->type(), SYMLINK);
  EXPECT_EQ(s->size(), 13u);
  EXPECT_EQ(*store_->readlink(s->ino()), "../some/where");
  EXPECT_EQ(store_->symlink(kRoot, kRootIno, "ln", "x").code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(store_->symlink(kRoot, kRootIno, "e", "").code(), ErrorCode::kNotFound);
  EXPECT_EQ(store_->symlink(kRoot, kRootIno, "l", std::string(4096, 'x')).code(),
            ErrorCode::kNameTooLong);
  auto f = store_->create(kRoot, kRootIno, "f", 0644, true);
  EXPECT_EQ(store_->readlink(f->ino()).code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(store_->unlink(kRoot, kRootIno, "ln").ok());
}

TEST_P(MetaTest, AccessAndBatchGetattr) {
  auto f = store_->create(kRoot, kRootIno, "f", 0640, true);
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(store_->access(kBob, f->ino(), 0).ok());
  EXPECT_EQ(store_->access(kBob, f->ino(), 4).code(), ErrorCode::kPermissionDenied);
  EXPECT_TRUE(store_->access(kRoot, f->ino(), 6).ok());
  EXPECT_EQ(store_->access(kRoot, f->ino(), 1).code(),
            ErrorCode::kPermissionDenied);  // no x bit at all
  EXPECT_EQ(store_->access(kRoot, 999999, 0).code(), ErrorCode::kNotFound);
  auto many = store_->batchGetattr({kRootIno, f->ino(), 999999});
  ASSERT_EQ(many.size(), 3u);
  EXPECT_EQ(many[0]->type(), DIRECTORY);
  EXPECT_EQ(many[1]->ino(), f->ino());
  EXPECT_EQ(many[2].code(), ErrorCode::kNotFound);
}

TEST_P(MetaTest, ExtendedAttributes) {
  uint64_t dir = dirOwnedBy(kAlice, 0755, "x");
  auto f = store_->create(kAlice, dir, "f", 0644, true);
  ASSERT_TRUE(f.ok());
  uint64_t ino = f->ino();
  EXPECT_TRUE(store_->setxattr(kAlice, ino, "user.a", "1", kXattrCreate).ok());
  EXPECT_EQ(store_->setxattr(kAlice, ino, "user.a", "2", kXattrCreate).code(),
            ErrorCode::kAlreadyExists);
  EXPECT_EQ(store_->setxattr(kAlice, ino, "user.b", "2", kXattrReplace).code(),
            ErrorCode::kNoAttribute);
  EXPECT_TRUE(store_->setxattr(kAlice, ino, "user.a", "3", kXattrReplace).ok());
  EXPECT_EQ(*store_->getxattr(kBob, ino, "user.a"), "3");
  EXPECT_EQ(store_->setxattr(kBob, ino, "user.a", "4", 0).code(), ErrorCode::kPermissionDenied);
  EXPECT_EQ(store_->setxattr(kAlice, ino, "trusted.t", "x", 0).code(), ErrorCode::kNotPermitted);
  EXPECT_TRUE(store_->setxattr(kRoot, ino, "trusted.t", "x", 0).ok());
  EXPECT_EQ(store_->setxattr(kAlice, ino, "weird.ns", "x", 0).code(), ErrorCode::kNotSupported);
  EXPECT_EQ(store_->setxattr(kAlice, ino, "user.big", std::string(65537, 'v'), 0).code(),
            ErrorCode::kValueTooLarge);
  EXPECT_EQ(store_->getxattr(kAlice, ino, "user.none").code(), ErrorCode::kNoAttribute);
  EXPECT_EQ(store_->getxattr(kAlice, ino, "user.none").status().toErrno(), ENODATA);
  EXPECT_EQ(*store_->listxattr(kAlice, ino), (std::vector<std::string>{"user.a"}));
  EXPECT_EQ(*store_->listxattr(kRoot, ino), (std::vector<std::string>{"trusted.t", "user.a"}));
  EXPECT_TRUE(store_->removexattr(kAlice, ino, "user.a").ok());
  EXPECT_EQ(store_->removexattr(kAlice, ino, "user.a").code(), ErrorCode::kNoAttribute);
  // Attributes go with the inode.
  ASSERT_TRUE(store_->setxattr(kAlice, ino, "user.c", "c", 0).ok());
  ASSERT_TRUE(store_->unlink(kAlice, dir, "f").ok());
  auto t = engine_->beginRead();
  EXPECT_TRUE(t->getRange(xattrBegin(ino), xattrEnd(ino))->kvs.empty());
}

TEST_P(MetaTest, OpenChecksAccessAndWriteOpensHoldSessions) {
  auto f = store_->create(kAlice, dirOwnedBy(kAlice, 0755, "o"), "f", 0640, true);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(store_->open(kBob, f->ino(), true, false, false, "c").code(),
            ErrorCode::kPermissionDenied);
  EXPECT_TRUE(store_->open(kCarol, f->ino(), true, false, false, "c").ok());
  EXPECT_EQ(store_->open(kCarol, f->ino(), false, true, false, "c").code(),
            ErrorCode::kPermissionDenied);
  auto w = store_->open(kAlice, f->ino(), true, true, false, "c");
  ASSERT_TRUE(w.ok());
  EXPECT_NE(w->session, 0u);
  auto closed = store_->close(f->ino(), w->session, 12345, true);
  ASSERT_TRUE(closed.ok());
  EXPECT_EQ(closed->size(), 12345u);
  // A session already ended (by a close, or by reapSessions when its client
  // fell silent) still lets the length count, and changes nothing else.
  auto again = store_->close(f->ino(), w->session, 0, false);
  ASSERT_TRUE(again.ok()) << again.status().toString();
  EXPECT_EQ(again->size(), 12345u);
  // A shorter length reported by a writer does not shrink the file.
  auto w2 = store_->open(kAlice, f->ino(), false, true, false, "c");
  EXPECT_EQ(store_->close(f->ino(), w2->session, 10, true)->size(), 12345u);
  auto tr = store_->open(kAlice, f->ino(), false, true, true, "c");
  ASSERT_TRUE(tr.ok());
  EXPECT_EQ(tr->inode.size(), 0u);
  ASSERT_TRUE(store_->close(f->ino(), tr->session, 0, false).ok());
  auto d = store_->lookup(kRoot, kRootIno, "o");
  EXPECT_EQ(store_->open(kRoot, d->ino(), false, true, false, "c").code(), ErrorCode::kIsDirectory);
}

TEST_P(MetaTest, UnlinkedFileStaysWhileOpenForWriting) {
  auto f = store_->create(kRoot, kRootIno, "f", 0644, true);
  auto w = store_->open(kRoot, f->ino(), false, true, false, "c");
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(store_->unlink(kRoot, kRootIno, "f").ok());
  auto still = store_->getattr(f->ino());
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->nlink(), 0u);
  auto report = fsck(*engine_);
  EXPECT_TRUE(report->clean());  // open-unlinked is not an orphan
  auto closed = store_->close(f->ino(), w->session, 3u << 20, true);
  ASSERT_TRUE(closed.ok());
  EXPECT_EQ(store_->getattr(f->ino()).code(), ErrorCode::kNotFound);
}

TEST_P(MetaTest, ReadOpenWithHoldKeepsAnUnlinkedFileUntilClose) {
  auto f = store_->create(kAlice, dirOwnedBy(kAlice, 0755, "h"), "f", 0640, true);
  ASSERT_TRUE(f.ok());
  // A hold is a read open: it needs read permission, not write.
  EXPECT_EQ(store_->open(kBob, f->ino(), true, false, false, "c", {}, /*hold=*/true).code(),
            ErrorCode::kPermissionDenied);
  auto r = store_->open(kCarol, f->ino(), true, false, false, "c", {}, /*hold=*/true);
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->session, 0u);
  auto d = store_->lookup(kRoot, kRootIno, "h");
  ASSERT_TRUE(store_->unlink(kAlice, d->ino(), "f").ok());
  EXPECT_TRUE(store_->getattr(f->ino()).ok());
  EXPECT_TRUE(fsck(*engine_)->clean());
  ASSERT_TRUE(store_->close(f->ino(), r->session, 0, false).ok());
  EXPECT_EQ(store_->getattr(f->ino()).code(), ErrorCode::kNotFound);
  EXPECT_EQ(store_->open(kRoot, d->ino(), true, false, false, "c", {}, true).code(),
            ErrorCode::kIsDirectory);
}

// An in-memory stand-in for the storage service (RemoteChunkRemover's own
// test runs the GC against storage servers).
class FakeChunkRemover : public ChunkRemover {
 public:
  Status removeFrom(uint64_t ino, const Layout& layout, uint64_t first) override {
    if (fail) return Status(ErrorCode::kIOError, "storage down");
    removed.insert({ino, first});
    EXPECT_EQ(layout.chains_size(), 4);
    return Status::OK();
  }
  std::set<std::pair<uint64_t, uint64_t>> removed;  // (inode, first chunk)
  bool fail = false;
};

TEST_P(MetaTest, GcWorkerRemovesTheChunksOfUnlinkedFilesOnce) {
  auto a = store_->create(kRoot, kRootIno, "a", 0644, true);
  auto b = store_->create(kRoot, kRootIno, "b", 0644, true);
  auto c = store_->create(kRoot, kRootIno, "c", 0644, true);
  ASSERT_TRUE(store_->setattr(kRoot, a->ino(), {.size = (3u << 20) + 5}).ok());  // 4 chunks
  ASSERT_TRUE(store_->setattr(kRoot, b->ino(), {.size = 4u << 20}).ok());
  // A truncate queues nothing: its client cut the chunks before it committed.
  ASSERT_TRUE(store_->setattr(kRoot, b->ino(), {.size = 1u << 20}).ok());
  ASSERT_TRUE(store_->setattr(kRoot, c->ino(), {.size = 2u << 20}).ok());
  auto w = store_->open(kRoot, c->ino(), false, true, false, "c");
  ASSERT_TRUE(store_->unlink(kRoot, kRootIno, "a").ok());
  ASSERT_TRUE(store_->unlink(kRoot, kRootIno, "c").ok());  // still open: must wait

  FakeChunkRemover storage;
  GcWorker gc(*engine_, storage);
  storage.fail = true;
  EXPECT_EQ(gc.runOnce().code(), ErrorCode::kIOError);  // nothing lost: entries stay queued
  storage.fail = false;
  auto done = gc.runOnce();
  ASSERT_TRUE(done.ok()) << done.status().toString();
  EXPECT_EQ(*done, 1u);
  // Every chunk of `a`, also any past its recorded length.
  EXPECT_EQ(storage.removed, (std::set<std::pair<uint64_t, uint64_t>>{{a->ino(), 0}}));
  EXPECT_EQ(*gc.runOnce(), 0u);  // the open file waits
  ASSERT_TRUE(store_->close(c->ino(), w->session, 0, false).ok());
  EXPECT_EQ(*gc.runOnce(), 1u);
  EXPECT_TRUE(storage.removed.count({c->ino(), 0}));
  EXPECT_EQ(*gc.runOnce(), 0u);
}

// A client that dies never closes: its sessions would keep unlinked files
// (and the GC away from them) for good. Clients renew a lease instead, and
// reapSessions() ends the sessions of one silent for session_timeout_ms.
TEST_P(MetaTest, SessionsOfClientsThatStopRenewingEndAsTheirCloseWould) {
  ManualClock clock;
  MetaOptions o;
  o.session_timeout_ms = 60000;
  MetaStore m(*engine_, o, clock);
  auto f = m.create(kRoot, kRootIno, "f", 0644, true);  // held by a
  auto g = m.create(kRoot, kRootIno, "g", 0644, true);  // held by a, unlinked
  auto h = m.create(kRoot, kRootIno, "h", 0644, true);  // held by b, which renews
  ASSERT_TRUE(f.ok() && g.ok() && h.ok());
  auto af = m.open(kRoot, f->ino(), false, true, false, "a");
  auto ag = m.open(kRoot, g->ino(), false, true, false, "a");
  auto bh = m.open(kRoot, h->ino(), false, true, false, "b");
  ASSERT_TRUE(af.ok() && ag.ok() && bh.ok());
  ASSERT_TRUE(m.unlink(kRoot, kRootIno, "g").ok());
  auto sessions = [&](uint64_t ino) {
    bool any = false;
    EXPECT_TRUE(kv::runReadTransaction(*engine_, [&](kv::ReadTransaction& t) -> Status {
                  ASSIGN_OR_RETURN(any, hasSessions(t, ino));
                  return Status::OK();
                }).ok());
    return any;
  };
  auto leases = [&] {
    auto t = engine_->beginRead();
    auto rows = t->getRange(kv::KeyWriter(kv::Prefix::kClientLease).key(),
                            kv::strinc(kv::KeyWriter(kv::Prefix::kClientLease).key()));
    return rows.ok() ? rows->kvs.size() : size_t{999};
  };

  clock.advance(std::chrono::seconds(30));
  ASSERT_TRUE(m.renewClient("b").ok());
  ASSERT_TRUE(m.renewClient("c").ok());  // a client holding nothing
  EXPECT_EQ(m.renewClient("").code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(*m.reapSessions(), 0u);         // nobody silent for 60 s yet
  clock.advance(std::chrono::seconds(40));  // a: 70 s since it opened; b, c: 40 s since renewing
  auto n = m.reapSessions();
  ASSERT_TRUE(n.ok()) << n.status().toString();
  EXPECT_EQ(*n, 2u);
  // g lost its last session: gone, its chunks queued; f keeps its name.
  EXPECT_EQ(m.getattr(g->ino()).code(), ErrorCode::kNotFound);
  auto t = engine_->beginRead();
  auto gc = t->getRange(gcBegin(), gcEnd());
  ASSERT_TRUE(gc.ok());
  ASSERT_EQ(gc->kvs.size(), 1u);
  EXPECT_FALSE(sessions(f->ino()));
  EXPECT_TRUE(sessions(h->ino()));
  EXPECT_EQ(leases(), 2u);
  // a was only slow: its close still records the length (g's inode is gone).
  auto closed = m.close(f->ino(), af->session, 100, true);
  ASSERT_TRUE(closed.ok()) << closed.status().toString();
  EXPECT_EQ(closed->size(), 100u);
  EXPECT_EQ(m.close(g->ino(), ag->session, 5, true).code(), ErrorCode::kNotFound);
  // b and c fall silent too: b's session ends, both leases are forgotten.
  clock.advance(std::chrono::seconds(61));
  EXPECT_EQ(*m.reapSessions(), 1u);
  EXPECT_FALSE(sessions(h->ino()));
  EXPECT_EQ(leases(), 0u);
  EXPECT_EQ(*m.reapSessions(), 0u);
}

// How far files' bytes reach in storage, in memory; `during` runs inside
// each call (a change that races the reaper).
class FakeStoredEnd : public StoredEnd {
 public:
  std::map<uint64_t, uint64_t> ends;
  std::map<uint64_t, uint64_t> asked_from;
  std::function<void(uint64_t ino)> during;
  bool down = false;  // storage does not answer
  int calls = 0;
  Result<uint64_t> storedEnd(uint64_t ino, const Layout&, uint64_t first) override {
    ++calls;
    if (down) return Status(ErrorCode::kDeadlineExceeded, "storage is down");
    asked_from[ino] = first;
    if (during) during(ino);
    auto it = ends.find(ino);
    return it == ends.end() ? uint64_t{0} : it->second;
  }
};

// A client that died after its bytes reached storage but before it recorded
// the length (no close, no fsync) left them past the file's end: the reaper
// asks storage how far they reach and grows the length to that, as the
// close would have. A file changed while storage was asked (here truncated)
// keeps its length; a file whose bytes end inside it is left as it is.
TEST_P(MetaTest, ReapedSessionsGrowTheLengthToTheBytesInStorage) {
  ManualClock clock;
  MetaOptions o;
  o.session_timeout_ms = 60000;
  MetaStore m(*engine_, o, clock);
  auto f = m.create(kRoot, kRootIno, "f", 0644, true);
  auto g = m.create(kRoot, kRootIno, "g", 0644, true);
  auto h = m.create(kRoot, kRootIno, "h", 0644, true);
  ASSERT_TRUE(f.ok() && g.ok() && h.ok());
  const uint64_t chunk = f->layout().chunk_size();
  // Each file got 3 chunks and 100 bytes recorded by an earlier writer.
  for (const auto& n : {*f, *g, *h}) {
    auto w = m.open(kRoot, n.ino(), false, true, false, "early");
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(m.close(n.ino(), w->session, 3 * chunk + 100, true).ok());
  }
  // Then client a opened each for writing and died.
  for (const auto& n : {*f, *g, *h})
    ASSERT_TRUE(m.open(kRoot, n.ino(), false, true, false, "a").ok());
  FakeStoredEnd stored;
  stored.ends[f->ino()] = 5 * chunk + 7;    // a wrote two chunks and 7 bytes more
  stored.ends[g->ino()] = 5 * chunk;        // likewise, but g is truncated meanwhile
  stored.ends[h->ino()] = 3 * chunk + 100;  // nothing past the end
  stored.during = [&](uint64_t ino) {
    if (ino != g->ino()) return;
    SetAttr cut;
    cut.size = 10;
    ASSERT_TRUE(m.setattr(kRoot, ino, cut).ok());
  };
  const int64_t before = m.getattr(f->ino())->mtime_ns();
  clock.advance(std::chrono::seconds(61));
  auto n = m.reapSessions(1000, &stored);
  ASSERT_TRUE(n.ok()) << n.status().toString();
  EXPECT_EQ(*n, 3u);
  EXPECT_EQ(stored.asked_from[f->ino()], 3u);  // from the chunk holding the end
  EXPECT_EQ(m.getattr(f->ino())->size(), 5 * chunk + 7);
  EXPECT_GT(m.getattr(f->ino())->mtime_ns(), before);
  EXPECT_EQ(m.getattr(g->ino())->size(), 10u);
  EXPECT_EQ(m.getattr(h->ino())->size(), 3 * chunk + 100);
  // Storage down: the sessions that need it wait for a later pass (after one
  // call), so the bytes are not lost; an unlinked file's ends all the same.
  auto p = m.create(kRoot, kRootIno, "p", 0644, true);
  auto q = m.create(kRoot, kRootIno, "q", 0644, true);
  auto u = m.create(kRoot, kRootIno, "u", 0644, true);
  ASSERT_TRUE(p.ok() && q.ok() && u.ok());
  for (const auto& x : {*p, *q, *u})
    ASSERT_TRUE(m.open(kRoot, x.ino(), false, true, false, "d").ok());
  ASSERT_TRUE(m.unlink(kRoot, kRootIno, "u").ok());
  stored.ends[p->ino()] = 2 * chunk;
  stored.ends[q->ino()] = chunk + 1;
  stored.down = true;
  stored.calls = 0;
  clock.advance(std::chrono::seconds(61));
  EXPECT_EQ(*m.reapSessions(1000, &stored), 1u);  // u's
  EXPECT_EQ(stored.calls, 1);
  EXPECT_EQ(m.getattr(u->ino()).code(), ErrorCode::kNotFound);
  stored.down = false;
  EXPECT_EQ(*m.reapSessions(1000, &stored), 2u);
  EXPECT_EQ(m.getattr(p->ino())->size(), 2 * chunk);
  EXPECT_EQ(m.getattr(q->ino())->size(), chunk + 1);
  // Without a StoredEnd (a meta service that cannot reach storage) the
  // length stays.
  auto k = m.create(kRoot, kRootIno, "k", 0644, true);
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE(m.open(kRoot, k->ino(), false, true, false, "b").ok());
  clock.advance(std::chrono::seconds(61));
  EXPECT_EQ(*m.reapSessions(), 1u);
  EXPECT_EQ(m.getattr(k->ino())->size(), 0u);
}

// Storage's chunk ids for checkChunks(), per target, in memory.
class FakeLister : public ChunkLister {
 public:
  std::vector<std::set<std::pair<uint64_t, uint32_t>>> held{2};
  std::pair<uint64_t, uint32_t> vanishes{0, 0};  // removed once listed (a racing GC)
  size_t targets() const override { return held.size(); }
  Result<std::vector<std::pair<uint64_t, uint32_t>>> list(size_t target, uint64_t inode,
                                                          uint32_t index, uint32_t limit) override {
    std::vector<std::pair<uint64_t, uint32_t>> out;
    for (auto it = held[target].lower_bound({inode, index});
         it != held[target].end() && out.size() < limit; ++it)
      out.push_back(*it);
    if (held[target].erase(vanishes) > 0) vanishes = {0, 0};
    return out;
  }
};

TEST_P(MetaTest, FsckFindsChunksOfNoFileAndCountsThosePastAnEnd) {
  auto a = store_->create(kRoot, kRootIno, "a", 0644, true);
  auto b = store_->create(kRoot, kRootIno, "b", 0644, true);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(store_->setattr(kRoot, a->ino(), {.size = (1u << 20) + 1}).ok());  // chunks 0, 1
  ASSERT_TRUE(store_->unlink(kRoot, kRootIno, "b").ok());  // its GC entry is queued
  FakeLister storage;
  storage.held[0] = {{a->ino(), 0}, {b->ino(), 0}, {900001, 2}};
  storage.held[1] = {{a->ino(), 1}, {a->ino(), 5}, {900000, 3}};
  storage.vanishes = {900001, 2};  // its delete's GC runs while fsck looks
  auto check = checkChunks(*engine_, storage);
  ASSERT_TRUE(check.ok()) << check.status().toString();
  EXPECT_EQ(check->chunks, 6u);
  EXPECT_EQ(check->past_end, 1u);  // a's chunk 5: bytes never recorded by a close
  EXPECT_EQ(check->orphans, 1u);
  ASSERT_EQ(check->problems.size(), 1u);
  EXPECT_EQ(check->problems[0], "chunk 900000:3 on target 2 belongs to no file");
  // Many pages of one file's chunks, and a clean store.
  FakeLister many;
  for (uint32_t i = 0; i < 2500; ++i) many.held[i % 2].insert({a->ino(), i});
  ASSERT_TRUE(store_->setattr(kRoot, a->ino(), {.size = 2500ull << 20}).ok());
  check = checkChunks(*engine_, many);
  ASSERT_TRUE(check.ok());
  EXPECT_EQ(check->chunks, 2500u);
  EXPECT_EQ(check->past_end, 0u);
  EXPECT_TRUE(check->problems.empty());
}

TEST_P(MetaTest, FsckFindsEachKindOfDamage) {
  expect_clean_ = false;
  auto d = store_->mkdir(kRoot, kRootIno, "d", 0755);
  auto f = store_->create(kRoot, d->ino(), "f", 0644, true);
  ASSERT_TRUE(d.ok() && f.ok());
  ASSERT_TRUE(fsck(*engine_)->clean());
  auto expectProblem = [&](const std::string& needle) {
    auto r = fsck(*engine_);
    ASSERT_TRUE(r.ok());
    bool found = false;
    for (auto& p : r->problems) found |= p.find(needle) != std::string::npos;
    EXPECT_TRUE(found) << "no problem mentioning '" << needle << "'";
  };
  DirEntry dangling;
  dangling.set_ino(424242);
  dangling.set_type(REGULAR);
  corrupt([&](kv::Transaction& t) { storeDentry(t, d->ino(), "ghost", dangling); });
  expectProblem("points to missing inode 424242");
  corrupt([&](kv::Transaction& t) { t.clear(dentryKey(d->ino(), "ghost")); });
  Inode wrong = *f;
  wrong.set_nlink(3);
  corrupt([&](kv::Transaction& t) { storeInode(t, wrong); });
  expectProblem("has nlink 3 but 1 dentries");
  corrupt([&](kv::Transaction& t) { t.clear(dentryKey(d->ino(), "f")); });
  expectProblem(fmt::format("orphan inode {}", f->ino()));
  // A cycle: d's parent points at a subdirectory of d.
  auto sub = store_->mkdir(kRoot, d->ino(), "sub", 0755);
  Inode looped = *store_->getattr(d->ino());
  looped.set_parent(sub->ino());
  corrupt([&](kv::Transaction& t) { storeInode(t, looped); });
  expectProblem("does not reach the root");
  corrupt([&](kv::Transaction& t) { t.atomicAdd(inodeCountKey(), 5); });
  expectProblem("inode counter says");
}

// Idempotency records serve retries for a few seconds; older ones are deleted
// so that the KV does not keep one per mutation ever made.
TEST_P(MetaTest, MutationRecordsExpireOldestFirstPerClient) {
  ManualClock clock;
  MetaStore timed(*engine_, {}, clock);
  auto mk = [&](const std::string& name, const std::string& client, uint64_t seq) {
    return timed.mkdir(kRoot, kRootIno, name, 0755, RequestId{client, seq});
  };
  auto count = [&] { return kv::countRows(*engine_, kv::Prefix::kIdempotency); };
  const int64_t hour = 3600LL * 1'000'000'000;
  ASSERT_TRUE(mk("a1", "a", 1).ok());
  ASSERT_TRUE(mk("a2", "a", 2).ok());
  ASSERT_TRUE(mk("b1", "b", 1).ok());
  clock.advance(std::chrono::hours(1));
  ASSERT_TRUE(mk("a3", "a", 3).ok());
  ASSERT_TRUE(mk("c1", "c", 1).ok());
  ASSERT_EQ(count(), 5u);
  const int64_t now = clock.wallMicros() * 1000;
  // Nothing is an hour and a half old.
  auto none = expireMutationRecords(*engine_, now, hour + hour / 2);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0u);
  // Half an hour: the first three go, a3 and c1 stay; at most `max` per call.
  auto one = expireMutationRecords(*engine_, now, hour / 2, /*max_deletes=*/1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, 1u);
  auto rest = expireMutationRecords(*engine_, now, hour / 2);
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(*rest, 2u);
  EXPECT_EQ(count(), 2u);
  // A live record still answers its retry; an expired one no longer does.
  EXPECT_TRUE(mk("a3", "a", 3).ok());
  EXPECT_EQ(mk("a1", "a", 1).code(), ErrorCode::kAlreadyExists);
  auto all = expireMutationRecords(*engine_, now + hour, hour / 2);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, 2u);
  EXPECT_EQ(count(), 0u);
}

INSTANTIATE_TEST_SUITE_P(AllEngines, MetaTest, ::testing::ValuesIn(kv::allEngines()),
                         [](const auto& info) { return info.param.name; });

// --- inline files ---

class InlineTest : public MetaTest {
 protected:
  // A new file of alice's, open for writing by its creating session.
  MetaStore::Opened created(const std::string& name) {
    auto o = store_->createOpen(kAlice, dir(), name, 0644, true, "c1");
    EXPECT_TRUE(o.ok()) << o.status().toString();
    EXPECT_TRUE(o->inode.inline_ok());
    return *o;
  }
  // A file whose bytes `data` were handed over at its first close.
  Inode inlined(const std::string& name, const std::string& data) {
    auto o = created(name);
    auto n = store_->close(o.inode.ino(), o.session, data.size(), true, {}, data);
    EXPECT_TRUE(n.ok()) << n.status().toString();
    EXPECT_TRUE(n->data_inline());
    return *n;
  }
  uint64_t dir() {
    if (dir_ino_ == 0) dir_ino_ = dirOwnedBy(kAlice, 0755);
    return dir_ino_;
  }
  std::string inlineRow(uint64_t ino) {
    std::string out = "<none>";
    EXPECT_TRUE(kv::runReadTransaction(*engine_, [&](kv::ReadTransaction& t) -> Status {
                  ASSIGN_OR_RETURN(auto v, t.get(inlineKey(ino)));
                  if (v) out = *v;
                  return Status::OK();
                }).ok());
    return out;
  }
  std::vector<GcEntry> gcEntries(uint64_t ino) {
    std::vector<GcEntry> out;
    EXPECT_TRUE(kv::runReadTransaction(*engine_, [&](kv::ReadTransaction& t) -> Status {
                  ASSIGN_OR_RETURN(auto rows, t.getRange(gcBegin(), gcEnd(), {}));
                  for (auto& row : rows.kvs) {
                    kv::KeyReader r(row.key);
                    ASSIGN_OR_RETURN(auto p, r.prefix());
                    (void)p;
                    ASSIGN_OR_RETURN(uint64_t got, r.u64());
                    GcEntry e;
                    EXPECT_TRUE(e.ParseFromString(row.value));
                    if (got == ino) out.push_back(e);
                  }
                  return Status::OK();
                }).ok());
    return out;
  }
  uint64_t dir_ino_ = 0;
};

TEST_P(InlineTest, TheCreatingSessionsCloseKeepsTheBytesInTheKv) {
  Inode n = inlined("f", "hello");
  EXPECT_EQ(n.size(), 5u);
  EXPECT_FALSE(n.inline_ok());
  EXPECT_EQ(inlineRow(n.ino()), "hello");
  auto got = store_->getattr(n.ino());
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->data_inline());
  auto r = store_->open(kBob, n.ino(), true, false, false, "c2");
  ASSERT_TRUE(r.ok()) << r.status().toString();
  EXPECT_EQ(r->inline_data, "hello");
  EXPECT_EQ(r->session, 0u);
  // An empty inline file is fine too, and a write open sees the bytes as well.
  Inode e = inlined("empty", "");
  EXPECT_EQ(e.size(), 0u);
  auto w = store_->open(kAlice, n.ino(), true, true, false, "c2");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->inline_data, "hello");
  EXPECT_TRUE(w->inode.data_inline());
  ASSERT_TRUE(store_->close(n.ino(), w->session, 5, false).ok());
  // A write-only open is not a read: no bytes.
  auto wo = store_->open(kAlice, n.ino(), false, true, false, "c2");
  ASSERT_TRUE(wo.ok());
  EXPECT_EQ(wo->inline_data, "");
  ASSERT_TRUE(store_->close(n.ino(), wo->session, 5, false).ok());
}

TEST_P(InlineTest, BytesAreRefusedUnlessTheCreatorIsTheOnlyWriterAndTheyFit) {
  // Too large: refused, and the session is still open for the ordinary close.
  auto big = created("big");
  std::string data(store_->options().inline_max_bytes + 1, 'x');
  EXPECT_EQ(store_->close(big.inode.ino(), big.session, data.size(), true, {}, data).code(),
            ErrorCode::kInlineRefused);
  auto closed = store_->close(big.inode.ino(), big.session, data.size(), true);
  ASSERT_TRUE(closed.ok()) << closed.status().toString();
  EXPECT_FALSE(closed->data_inline());
  EXPECT_FALSE(closed->inline_ok());
  // A second writer opened meanwhile: its bytes may be in chunks.
  auto two = created("two");
  auto other = store_->open(kAlice, two.inode.ino(), false, true, false, "c2");
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->inode.inline_ok());
  EXPECT_EQ(store_->close(two.inode.ino(), two.session, 3, true, {}, std::string("abc")).code(),
            ErrorCode::kInlineRefused);
  // A truncate came first.
  auto cut = created("cut");
  SetAttr a;
  a.size = 10;
  ASSERT_TRUE(store_->setattr(kAlice, cut.inode.ino(), a).ok());
  EXPECT_EQ(store_->close(cut.inode.ino(), cut.session, 10, true, {}, std::string(10, 'a')).code(),
            ErrorCode::kInlineRefused);
  // Not the whole file; no session; twice.
  auto part = created("part");
  EXPECT_EQ(store_->close(part.inode.ino(), part.session, 4, true, {}, std::string("abc")).code(),
            ErrorCode::kInlineRefused);
  EXPECT_EQ(store_->close(part.inode.ino(), 0, 3, true, {}, std::string("abc")).code(),
            ErrorCode::kInlineRefused);
  Inode once = inlined("once", "abc");
  auto again = store_->open(kAlice, once.ino(), false, true, false, "c1");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(store_->close(once.ino(), again->session, 3, true, {}, std::string("xyz")).code(),
            ErrorCode::kInlineRefused);
  // Chunk writes to an inline file without converting it first: a protocol error.
  EXPECT_EQ(store_->close(once.ino(), again->session, 3, true).code(), ErrorCode::kInlineRefused);
  EXPECT_EQ(inlineRow(once.ino()), "abc");
  ASSERT_TRUE(store_->close(once.ino(), again->session, 3, false).ok());
  // Turned off by configuration: files are created without inline_ok.
  MetaOptions off;
  off.inline_max_bytes = 0;
  MetaStore plain(*engine_, off);
  auto o = plain.createOpen(kAlice, dir(), "plain", 0644, true, "c1");
  ASSERT_TRUE(o.ok());
  EXPECT_FALSE(o->inode.inline_ok());
  EXPECT_EQ(plain.close(o->inode.ino(), o->session, 1, true, {}, std::string("a")).code(),
            ErrorCode::kInlineRefused);
  ASSERT_TRUE(plain.close(o->inode.ino(), o->session, 1, true).ok());
  ASSERT_TRUE(store_->close(big.inode.ino(), 0, 0, false).ok());
  for (auto* o2 : {&two, &cut, &part})
    ASSERT_TRUE(store_->close(o2->inode.ino(), o2->session, 0, false).ok());
  ASSERT_TRUE(store_->close(two.inode.ino(), other->session, 0, false).ok());
}

TEST_P(InlineTest, UninlineLocksMovesAndFinishesOnce) {
  Inode n = inlined("f", "hello");
  // Moving the bytes is writing: bob may not (0644, alice's).
  EXPECT_EQ(store_->uninline(kBob, n.ino(), 0).code(), ErrorCode::kPermissionDenied);
  auto begin = store_->uninline(kAlice, n.ino(), 0);
  ASSERT_TRUE(begin.ok()) << begin.status().toString();
  EXPECT_TRUE(begin->was_inline);
  EXPECT_EQ(begin->data, "hello");
  EXPECT_NE(begin->token, 0u);
  // Another converter, a truncate in place and an O_TRUNC open wait for the holder.
  EXPECT_EQ(store_->uninline(kAlice, n.ino(), 0).code(), ErrorCode::kInodeBusy);
  SetAttr a;
  a.size = 2;
  EXPECT_EQ(store_->setattr(kAlice, n.ino(), a).code(), ErrorCode::kInodeBusy);
  EXPECT_EQ(store_->open(kAlice, n.ino(), false, true, true, "c2").code(), ErrorCode::kInodeBusy);
  // Readers still get the bytes meanwhile.
  EXPECT_EQ(store_->open(kBob, n.ino(), true, false, false, "c2")->inline_data, "hello");
  EXPECT_EQ(store_->uninline(kAlice, n.ino(), begin->token + 1).code(), ErrorCode::kInlineRefused);
  auto done = store_->uninline(kAlice, n.ino(), begin->token);
  ASSERT_TRUE(done.ok()) << done.status().toString();
  EXPECT_TRUE(done->was_inline);
  EXPECT_FALSE(done->inode.data_inline());
  EXPECT_EQ(done->inode.convert_token(), 0u);
  EXPECT_EQ(done->inode.size(), 5u);
  EXPECT_EQ(inlineRow(n.ino()), "<none>");
  EXPECT_EQ(store_->open(kBob, n.ino(), true, false, false, "c2")->inline_data, "");
  auto after = store_->uninline(kAlice, n.ino(), 0);
  ASSERT_TRUE(after.ok());
  EXPECT_FALSE(after->was_inline);
  // An ordinary file now: writers' chunked closes are fine, and it never goes inline again.
  auto w = store_->open(kAlice, n.ino(), false, true, false, "c2");
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(store_->close(n.ino(), w->session, 5, true).ok());
}

TEST_P(InlineTest, AnExpiredLeaseIsTakenOverAndItsHolderMustBeginAgain) {
  Inode n = inlined("f", "abc");
  MetaOptions o;
  o.inline_convert_lease_ms = 1;
  MetaStore quick(*engine_, o);
  auto first = quick.uninline(kAlice, n.ino(), 0);
  ASSERT_TRUE(first.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto second = quick.uninline(kAlice, n.ino(), 0);
  ASSERT_TRUE(second.ok()) << second.status().toString();
  EXPECT_NE(second->token, first->token);
  EXPECT_EQ(quick.uninline(kAlice, n.ino(), first->token).code(), ErrorCode::kInlineRefused);
  ASSERT_TRUE(quick.uninline(kAlice, n.ino(), second->token).ok());
  EXPECT_FALSE(store_->getattr(n.ino())->data_inline());
}

TEST_P(InlineTest, RetriedCallsReturnTheFirstOutcome) {
  auto o = created("f");
  RequestId rid{"c1", 7};
  auto first = store_->close(o.inode.ino(), o.session, 3, true, rid, std::string("abc"));
  ASSERT_TRUE(first.ok());
  auto replay = store_->close(o.inode.ino(), o.session, 3, true, rid, std::string("abc"));
  ASSERT_TRUE(replay.ok()) << replay.status().toString();
  EXPECT_TRUE(replay->data_inline());
  RequestId b{"c1", 8};
  auto begin = store_->uninline(kAlice, o.inode.ino(), 0, b);
  auto again = store_->uninline(kAlice, o.inode.ino(), 0, b);
  ASSERT_TRUE(begin.ok() && again.ok());
  EXPECT_EQ(again->token, begin->token);
  EXPECT_EQ(again->data, "abc");
  ASSERT_TRUE(store_->uninline(kAlice, o.inode.ino(), begin->token).ok());
}

TEST_P(InlineTest, TruncatesChangeTheBytesInPlaceUpToTheLimit) {
  Inode n = inlined("f", "hello");
  SetAttr a;
  a.size = 2;
  auto cut = store_->setattr(kAlice, n.ino(), a);
  ASSERT_TRUE(cut.ok()) << cut.status().toString();
  EXPECT_TRUE(cut->data_inline());
  EXPECT_EQ(inlineRow(n.ino()), "he");
  a.size = 6;
  ASSERT_TRUE(store_->setattr(kAlice, n.ino(), a).ok());
  EXPECT_EQ(inlineRow(n.ino()), std::string("he\0\0\0\0", 6));
  a.size = store_->options().inline_max_bytes + 1;
  EXPECT_EQ(store_->setattr(kAlice, n.ino(), a).code(), ErrorCode::kInlineRefused);
  EXPECT_EQ(store_->getattr(n.ino())->size(), 6u);
  a.size = 0;
  ASSERT_TRUE(store_->setattr(kAlice, n.ino(), a).ok());
  EXPECT_EQ(inlineRow(n.ino()), "");
  // O_TRUNC makes it an ordinary empty file...
  Inode e = inlined("e", "hello");
  auto o = store_->open(kAlice, e.ino(), false, true, true, "c2");
  ASSERT_TRUE(o.ok()) << o.status().toString();
  EXPECT_FALSE(o->inode.data_inline());
  EXPECT_EQ(o->inode.size(), 0u);
  EXPECT_EQ(inlineRow(e.ino()), "<none>");
  ASSERT_TRUE(store_->close(e.ino(), o->session, 0, false).ok());
  // ...unless a conversion began and its lease ran out: chunk 0 may hold its
  // leftovers, so the file stays inline and empty, and the writer's own
  // conversion removes chunk 0 (fenced by its lease); nothing is queued.
  Inode m = inlined("g", "world");
  MetaOptions quick;
  quick.inline_convert_lease_ms = 1;
  ASSERT_TRUE(MetaStore(*engine_, quick).uninline(kAlice, m.ino(), 0).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto t = store_->open(kAlice, m.ino(), false, true, true, "c2");
  ASSERT_TRUE(t.ok()) << t.status().toString();
  EXPECT_TRUE(t->inode.data_inline());
  EXPECT_NE(t->inode.convert_token(), 0u);
  EXPECT_EQ(t->inode.size(), 0u);
  EXPECT_EQ(t->inline_data, "");
  EXPECT_EQ(inlineRow(m.ino()), "");
  EXPECT_TRUE(gcEntries(m.ino()).empty());
  auto begin = store_->uninline(kAlice, m.ino(), 0);
  ASSERT_TRUE(begin.ok()) << begin.status().toString();
  EXPECT_TRUE(begin->was_inline);
  EXPECT_EQ(begin->data, "");
  ASSERT_TRUE(store_->uninline(kAlice, m.ino(), begin->token).ok());
  ASSERT_TRUE(store_->close(m.ino(), t->session, 0, false).ok());
}

TEST_P(InlineTest, UnlinkRemovesTheBytesWithTheInode) {
  // Never converted: no chunk can exist, the GC has nothing to remove.
  Inode n = inlined("f", "hello");
  ASSERT_TRUE(store_->unlink(kAlice, dir(), "f").ok());
  EXPECT_EQ(inlineRow(n.ino()), "<none>");
  auto gc = gcEntries(n.ino());
  ASSERT_EQ(gc.size(), 1u);
  EXPECT_TRUE(gc[0].whole_file());
  EXPECT_TRUE(gc[0].no_chunks());
  // A conversion began and never finished: chunk 0 may hold leftovers.
  Inode c = inlined("c", "hello");
  ASSERT_TRUE(store_->uninline(kAlice, c.ino(), 0).ok());
  ASSERT_TRUE(store_->unlink(kAlice, dir(), "c").ok());
  gc = gcEntries(c.ino());
  ASSERT_EQ(gc.size(), 1u);
  EXPECT_FALSE(gc[0].no_chunks());
  // Open-unlinked: the bytes stay readable until the last session closes.
  Inode m = inlined("g", "world");
  auto held = store_->open(kAlice, m.ino(), true, false, false, "c2", {}, /*hold=*/true);
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(store_->unlink(kAlice, dir(), "g").ok());
  EXPECT_EQ(store_->open(kBob, m.ino(), true, false, false, "c3")->inline_data, "world");
  ASSERT_TRUE(store_->close(m.ino(), held->session, 0, false).ok());
  EXPECT_EQ(inlineRow(m.ino()), "<none>");
  EXPECT_EQ(store_->getattr(m.ino()).code(), ErrorCode::kNotFound);
}

TEST_P(InlineTest, FsckFindsMissingStrayAndMisSizedBytes) {
  expect_clean_ = false;
  Inode a = inlined("a", "abc");
  Inode b = inlined("b", "defg");
  auto c = created("c");
  corrupt([&](kv::Transaction& t) {
    t.clear(inlineKey(a.ino()));
    t.set(inlineKey(b.ino()), "de");
    t.set(inlineKey(c.inode.ino()), "zz");
  });
  auto report = fsck(*engine_);
  ASSERT_TRUE(report.ok());
  std::string all;
  for (auto& p : report->problems) all += p + "\n";
  EXPECT_NE(all.find(fmt::format("inline inode {} has no inline bytes", a.ino())),
            std::string::npos)
      << all;
  EXPECT_NE(all.find(fmt::format("inode {} has size 4 but 2 inline bytes", b.ino())),
            std::string::npos)
      << all;
  EXPECT_NE(all.find(fmt::format("inline bytes of inode {}, which is not", c.inode.ino())),
            std::string::npos)
      << all;
  EXPECT_EQ(report->problems.size(), 3u) << all;
  // A reader meets the missing bytes as corruption, not as an empty file.
  EXPECT_EQ(store_->open(kBob, a.ino(), true, false, false, "c2").code(), ErrorCode::kCorruption);
}

INSTANTIATE_TEST_SUITE_P(AllEngines, InlineTest, ::testing::ValuesIn(kv::allEngines()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace cistern::meta
