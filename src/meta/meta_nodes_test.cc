// MetaStore on every KV engine: FIFOs, sockets and device nodes (mknod).
#include <gtest/gtest.h>
#include <sys/sysmacros.h>

#include "meta/meta_test_util.h"
#include "proto/file_type.h"

namespace cistern::meta {
namespace {

using namespace test_util;

TEST_P(MetaTest, MknodKeepsEachSpecialTypeAndADevicesNumber) {
  uint64_t d = dirOwnedBy(kAlice, 0755);
  struct Case {
    const char* name;
    FileType type;
    uint64_t rdev;
    uint64_t stored_rdev;
  } cases[] = {{"fifo", FIFO, makedev(1, 2), 0},
               {"sock", SOCKET, 0, 0},
               {"chr", CHAR_DEVICE, makedev(1, 3), makedev(1, 3)},
               {"blk", BLOCK_DEVICE, makedev(259, 70000), makedev(259, 70000)}};
  for (const auto& c : cases) {
    auto n = store_->mknod(kRoot, d, c.name, c.type, 0640, c.rdev);
    ASSERT_TRUE(n.ok()) << c.name << ": " << n.status().toString();
    EXPECT_EQ(n->type(), c.type) << c.name;
    EXPECT_EQ(n->mode(), 0640u) << c.name;
    EXPECT_EQ(n->rdev(), c.stored_rdev) << c.name;  // FIFOs and sockets keep none
    EXPECT_EQ(n->nlink(), 1u);
    auto looked = store_->lookup(kAlice, d, c.name);
    ASSERT_TRUE(looked.ok());
    EXPECT_EQ(looked->type(), c.type);
    EXPECT_EQ(looked->rdev(), c.stored_rdev);
  }
  auto page = store_->readdir(kRoot, d, "", 0);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->entries.size(), 4u);
  for (const auto& e : page->entries) EXPECT_TRUE(isSpecial(e.entry.type())) << e.name;
}

TEST_P(MetaTest, MknodRefusesOtherTypesAndChecksInLinuxOrder) {
  uint64_t d = dirOwnedBy(kAlice, 0755);
  for (FileType t : {REGULAR, DIRECTORY, SYMLINK, FILE_TYPE_UNSPECIFIED})
    EXPECT_EQ(store_->mknod(kAlice, d, "x", t, 0644, 0).code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(store_->mknod(kAlice, d, "p", FIFO, 0644, 0).ok());
  // An existing name wins over everything but the type (as do_mknodat).
  EXPECT_EQ(store_->mknod(kBob, d, "p", CHAR_DEVICE, 0644, 0).code(), ErrorCode::kAlreadyExists);
  // Then write permission on the directory, then CAP_MKNOD for devices.
  EXPECT_EQ(store_->mknod(kBob, d, "q", CHAR_DEVICE, 0644, 0).code(), ErrorCode::kPermissionDenied);
  EXPECT_EQ(store_->mknod(kAlice, d, "q", CHAR_DEVICE, 0644, makedev(1, 3)).code(),
            ErrorCode::kNotPermitted);
  EXPECT_EQ(store_->mknod(kAlice, d, "q", BLOCK_DEVICE, 0644, 0).code(), ErrorCode::kNotPermitted);
  EXPECT_TRUE(store_->mknod(kAlice, d, "s", SOCKET, 0755, 0).ok());  // anyone may make these
  EXPECT_EQ(store_->mknod(kAlice, d, ".", FIFO, 0644, 0).code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(store_->mknod(kAlice, d, "", FIFO, 0644, 0).code(), ErrorCode::kNotFound);
  EXPECT_EQ(store_->mknod(kAlice, kRootIno + 999, "z", FIFO, 0644, 0).code(), ErrorCode::kNotFound);
}

TEST_P(MetaTest, SpecialNodesLinkRenameChmodAndUnlinkLikeFiles) {
  uint64_t d = dirOwnedBy(kAlice, 0755);
  auto p = store_->mknod(kAlice, d, "p", FIFO, 0600, 0);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(store_->link(kAlice, p->ino(), d, "p2").ok());
  EXPECT_EQ(store_->getattr(p->ino())->nlink(), 2u);
  ASSERT_TRUE(store_->rename(kAlice, d, "p2", d, "p3").ok());
  SetAttr chmod;
  chmod.mode = 0644;
  EXPECT_EQ(store_->setattr(kBob, p->ino(), chmod).code(), ErrorCode::kNotPermitted);
  ASSERT_TRUE(store_->setattr(kAlice, p->ino(), chmod).ok());
  // Truncating a FIFO is EINVAL, as on Linux.
  SetAttr trunc;
  trunc.size = 0;
  EXPECT_EQ(store_->setattr(kRoot, p->ino(), trunc).code(), ErrorCode::kInvalidArgument);
  // user.* attributes only on files and directories (EPERM), as on ext4.
  EXPECT_EQ(store_->setxattr(kAlice, p->ino(), "user.a", "v", 0).code(), ErrorCode::kNotPermitted);
  // A write open of a FIFO takes no session and needs no chunks: the data
  // is the kernel's; unlinking it queues no chunks for the GC either.
  ASSERT_TRUE(store_->unlink(kAlice, d, "p").ok());
  ASSERT_TRUE(store_->unlink(kAlice, d, "p3").ok());
  EXPECT_EQ(store_->getattr(p->ino()).code(), ErrorCode::kNotFound);
  auto inodes = store_->statfs();
  ASSERT_TRUE(inodes.ok());
}

TEST_P(MetaTest, TruncatePastTheLargestFileSizeIsEFBIG) {
  uint64_t d = dirOwnedBy(kAlice, 0755);
  auto f = store_->create(kAlice, d, "f", 0644, true);
  ASSERT_TRUE(f.ok());
  SetAttr a;
  a.size = kMaxFileBytes + 1;
  auto r = store_->setattr(kAlice, f->ino(), a);
  EXPECT_EQ(r.code(), ErrorCode::kFileTooLarge);
  EXPECT_EQ(r.status().toErrno(), EFBIG);
  a.size = kMaxFileBytes;
  ASSERT_TRUE(store_->setattr(kAlice, f->ino(), a).ok());
  EXPECT_EQ(store_->getattr(f->ino())->size(), kMaxFileBytes);
  // Write permission comes first, as vfs_truncate checks it before the size.
  a.size = kMaxFileBytes + 1;
  EXPECT_EQ(store_->setattr(kBob, f->ino(), a).code(), ErrorCode::kPermissionDenied);
}

}  // namespace
}  // namespace cistern::meta
