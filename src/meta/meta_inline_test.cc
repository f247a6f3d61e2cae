// MetaStore on every KV engine: small files whose bytes live in the KV
// (inline), their conversion to chunks, truncates and fsck of them.
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

INSTANTIATE_TEST_SUITE_P(AllEngines, InlineTest, ::testing::ValuesIn(kv::suiteEngines()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace cistern::meta
