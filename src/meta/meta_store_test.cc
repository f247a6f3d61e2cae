// MetaStore behaviour on every KV engine: each namespace operation's success
// and error cases with their errno, a permission matrix, concurrency and
// replays. Sessions, GC and fsck: meta_sessions_test.cc; inline files:
// meta_inline_test.cc; FIFOs, sockets and devices: meta_nodes_test.cc.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "common/random.h"
#include "kv/key_codec.h"
#include "meta/gc_worker.h"
#include "meta/meta_test_util.h"
#include "meta/record_expiry.h"

namespace cistern::meta {
namespace {

using namespace test_util;

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

// New files' first chunks spread evenly over the chains, whatever the
// stride of inode numbers.
TEST_P(MetaTest, NewFilesStartOnEveryChain) {
  std::map<uint32_t, int> first;
  for (int i = 0; i < 80; ++i) {
    auto f = store_->create(kRoot, kRootIno, "s" + std::to_string(i), 0644, true);
    ASSERT_TRUE(f.ok()) << f.status().toString();
    ++first[f->layout().chains(0)];
  }
  ASSERT_EQ(first.size(), 4u);
  for (auto [chain, n] : first) EXPECT_GE(n, 8) << "chain " << chain;
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

INSTANTIATE_TEST_SUITE_P(AllEngines, MetaTest, ::testing::ValuesIn(kv::suiteEngines()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace cistern::meta
