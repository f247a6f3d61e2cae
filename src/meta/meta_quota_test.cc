// Quotas (docs/quota.md) on the metadata store, on every KV engine: inodes
// and bytes are counted in every quota directory above, creates and
// reservations past a limit are kQuotaExceeded, closes and truncates move
// the charge to what the file holds, renames carry it along, statfs of a
// quota directory shows the quota.
#include <fmt/format.h>

#include "kv/kv_test_util.h"
#include "meta/meta_test_util.h"

namespace cistern::meta {
namespace {

using namespace test_util;

class MetaQuotaTest : public MetaTest {
 protected:
  uint64_t mkdir(uint64_t parent, const std::string& name) {
    auto d = store_->mkdir(kRoot, parent, name, 0777);
    EXPECT_TRUE(d.ok()) << d.status().toString();
    return d.ok() ? d->ino() : 0;
  }
  MetaStore::QuotaInfo use(uint64_t dir) {
    auto q = store_->getQuota(dir);
    EXPECT_TRUE(q.ok()) << q.status().toString();
    return q.ok() ? *q : MetaStore::QuotaInfo{};
  }
  // A file of `bytes` written and closed in `dir`.
  Status writeFile(uint64_t dir, const std::string& name, uint64_t bytes) {
    ASSIGN_OR_RETURN(auto o, store_->createOpen(kRoot, dir, name, 0644, true, "c1"));
    if (bytes > 0) RETURN_ON_ERROR(store_->reserve(o.inode.ino(), o.session, bytes).status());
    return store_->close(o.inode.ino(), o.session, bytes, bytes > 0).status();
  }
};

TEST_P(MetaQuotaTest, InodesAreCountedAndLimitedInEveryQuotaAbove) {
  const uint64_t top = mkdir(kRootIno, "top");
  const uint64_t sub = mkdir(top, "sub");
  ASSERT_TRUE(writeFile(top, "before", 0).ok());  // there before the quota: summed when set
  auto q = store_->setQuota(top, 0, 5);
  ASSERT_TRUE(q.ok()) << q.status().toString();
  EXPECT_EQ(q->inodes_used, 2);  // sub and before
  ASSERT_TRUE(store_->setQuota(sub, 0, 100).ok());
  ASSERT_TRUE(writeFile(sub, "a", 0).ok());
  ASSERT_TRUE(store_->mkdir(kRoot, sub, "b", 0755).ok());
  EXPECT_EQ(use(top).inodes_used, 4);
  EXPECT_EQ(use(sub).inodes_used, 2);
  ASSERT_TRUE(store_->symlink(kRoot, top, "c", "a").ok());
  Status full = store_->mkdir(kRoot, sub, "d", 0755).status();  // the 6th: over top's 5
  EXPECT_EQ(full.code(), ErrorCode::kQuotaExceeded) << full.toString();
  EXPECT_NE(full.message().find(fmt::format("directory {} holds 5 of its 5 inodes", top)),
            std::string::npos)
      << full.toString();
  EXPECT_EQ(use(sub).inodes_used, 2);  // nothing of the refused create counted
  // Removing frees; then it fits.
  ASSERT_TRUE(store_->unlink(kRoot, sub, "a").ok());
  ASSERT_TRUE(store_->mkdir(kRoot, sub, "d", 0755).ok());
  EXPECT_EQ(use(top).inodes_used, 5);
  // statfs of a directory under the quota shows it (the nearest one: sub).
  auto st = store_->statfs(sub);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->inodes_total, 100u);
  EXPECT_EQ(st->inodes_used, 2u);
  // Removed with its directory; the quota count goes with it.
  ASSERT_TRUE(store_->rmdir(kRoot, sub, "b").ok());
  ASSERT_TRUE(store_->rmdir(kRoot, sub, "d").ok());
  ASSERT_TRUE(store_->rmdir(kRoot, top, "sub").ok());
  EXPECT_EQ(store_->getQuota(sub).code(), ErrorCode::kNotFound);
  auto all = store_->listQuotas();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].dir, top);
  EXPECT_EQ((*all)[0].inodes_used, 2);  // before, c
}

TEST_P(MetaQuotaTest, WritersReserveBytesBeforeWritingAndCloseChargesWhatTheyWrote) {
  const uint64_t dir = mkdir(kRootIno, "q");
  ASSERT_TRUE(store_->setQuota(dir, 10 << 20, 0).ok());
  auto o = store_->createOpen(kRoot, dir, "f", 0644, true, "c1");
  ASSERT_TRUE(o.ok());
  auto r = store_->reservation(o->inode.ino());
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->under_quota);
  EXPECT_EQ(r->reserve_to, 0u);
  ASSERT_TRUE(store_->reserve(o->inode.ino(), o->session, 8 << 20).ok());
  EXPECT_EQ(use(dir).bytes_used, 8 << 20);
  // A second writer: 3 MiB more do not fit beside the first's 8.
  auto o2 = store_->createOpen(kRoot, dir, "g", 0644, true, "c2");
  ASSERT_TRUE(o2.ok());
  auto over = store_->reserve(o2->inode.ino(), o2->session, 3 << 20);
  EXPECT_EQ(over.code(), ErrorCode::kQuotaExceeded) << over.status().toString();
  // The first closes having written 1 MiB: charged that, the rest freed.
  ASSERT_TRUE(store_->close(o->inode.ino(), o->session, 1 << 20, true).ok());
  EXPECT_EQ(use(dir).bytes_used, 1 << 20);
  ASSERT_TRUE(store_->reserve(o2->inode.ino(), o2->session, 3 << 20).ok());
  // A reservation needs the file open for writing.
  ASSERT_TRUE(store_->close(o2->inode.ino(), o2->session, 3 << 20, true).ok());
  EXPECT_EQ(store_->reserve(o2->inode.ino(), 0, 5 << 20).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(use(dir).bytes_used, 4 << 20);
  // Truncating up past the limit is refused; down frees.
  SetAttr grow;
  grow.size = 20 << 20;
  EXPECT_EQ(store_->setattr(kRoot, o2->inode.ino(), grow).code(), ErrorCode::kQuotaExceeded);
  SetAttr cut;
  cut.size = 1 << 20;
  ASSERT_TRUE(store_->setattr(kRoot, o2->inode.ino(), cut).ok());
  EXPECT_EQ(use(dir).bytes_used, 2 << 20);
  auto st = store_->statfs(dir);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->bytes_total, 10u << 20);
  EXPECT_EQ(st->bytes_free, 8u << 20);
  // Unlinked: its bytes and inode go.
  ASSERT_TRUE(store_->unlink(kRoot, dir, "f").ok());
  EXPECT_EQ(use(dir).bytes_used, 1 << 20);
  EXPECT_EQ(use(dir).inodes_used, 1);
  // An open-unlinked file keeps its charge until its last close.
  auto o3 = store_->open(kRoot, o2->inode.ino(), false, true, false, "c3");
  ASSERT_TRUE(o3.ok());
  ASSERT_TRUE(store_->unlink(kRoot, dir, "g").ok());
  EXPECT_EQ(use(dir).bytes_used, 1 << 20);
  ASSERT_TRUE(store_->close(o2->inode.ino(), o3->session, 0, false).ok());
  EXPECT_EQ(use(dir).bytes_used, 0);
  EXPECT_EQ(use(dir).inodes_used, 0);
}

TEST_P(MetaQuotaTest, RenamesCarryChargesAcrossQuotasAndDirectoriesStay) {
  const uint64_t a = mkdir(kRootIno, "a");
  const uint64_t b = mkdir(kRootIno, "b");
  ASSERT_TRUE(store_->setQuota(a, 0, 10).ok());
  ASSERT_TRUE(store_->setQuota(b, 3 << 20, 10).ok());
  ASSERT_TRUE(writeFile(a, "small", 1 << 20).ok());
  ASSERT_TRUE(writeFile(a, "big", 4 << 20).ok());
  EXPECT_EQ(use(a).bytes_used, 5 << 20);
  ASSERT_TRUE(store_->rename(kRoot, a, "small", b, "small", 0).ok());
  EXPECT_EQ(use(a).bytes_used, 4 << 20);
  EXPECT_EQ(use(a).inodes_used, 1);
  EXPECT_EQ(use(b).bytes_used, 1 << 20);
  EXPECT_EQ(use(b).inodes_used, 1);
  EXPECT_EQ(store_->rename(kRoot, a, "big", b, "big", 0).code(), ErrorCode::kQuotaExceeded);
  EXPECT_EQ(use(a).bytes_used, 4 << 20);  // nothing moved
  // A directory between quotas: EXDEV (mv copies); within one, fine.
  const uint64_t d = mkdir(a, "d");
  EXPECT_EQ(store_->rename(kRoot, a, "d", b, "d", 0).code(), ErrorCode::kCrossQuota);
  const uint64_t e = mkdir(a, "e");
  ASSERT_TRUE(store_->rename(kRoot, a, "d", e, "d", 0).ok());
  (void)d;
  // Changing a limit keeps the use; removing the quota drops its counters.
  auto changed = store_->setQuota(a, 0, 4);
  ASSERT_TRUE(changed.ok());
  EXPECT_EQ(changed->inodes_used, 3);  // big, e, d
  ASSERT_TRUE(store_->setQuota(a, 0, 0).ok());
  EXPECT_EQ(store_->getQuota(a).code(), ErrorCode::kNotFound);
  EXPECT_EQ(store_->setQuota(store_->lookup(kRoot, a, "big")->ino(), 1, 1).code(),
            ErrorCode::kNotDirectory);
}

TEST_P(MetaQuotaTest, WithNoQuotaNothingIsChargedOrChecked) {
  ASSERT_TRUE(writeFile(kRootIno, "f", 1 << 20).ok());
  auto r = store_->reservation(store_->lookup(kRoot, kRootIno, "f")->ino());
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->under_quota);
  EXPECT_EQ(kv::countRows(*engine_, kv::Prefix::kQuota), 0u);
}

INSTANTIATE_TEST_SUITE_P(AllEngines, MetaQuotaTest, ::testing::ValuesIn(kv::suiteEngines()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace cistern::meta
