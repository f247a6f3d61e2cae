// MetaStore on every KV engine: opens and their write sessions, sessions of
// clients that die, the GC of unlinked files, fsck, and the expiry of
// mutation records.
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
  corrupt([&](kv::Transaction& t) { t.atomicAdd(inodeCountKey(7), 5); });
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

}  // namespace
}  // namespace cistern::meta
