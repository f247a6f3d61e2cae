// Permission cases of the POSIX suite: each row sets something up as root,
// then runs one call as an unprivileged user (uid 1000, gid 1000) in a child
// process and checks the errno it got (0: allowed).
#include <dirent.h>
#include <sys/xattr.h>

#include "tests/fuse/mount_env.h"

namespace cistern::testing {
namespace {

struct PermCase {
  const char* name;
  // Runs as root in the test's directory `d` (mode 0777).
  std::function<void(const std::string& d)> setup;
  // Runs as kUser; returns 0 or an errno.
  std::function<int(const std::string& d)> step;
  int want;
  gid_t extra_group = 0;  // a supplementary group of the user
};

void file(const std::string& p, mode_t mode, uid_t uid = 0, gid_t gid = 0) {
  ASSERT_TRUE(writeFile(p, "data"));
  ASSERT_EQ(::chown(p.c_str(), uid, gid), 0);
  ASSERT_EQ(::chmod(p.c_str(), mode), 0);
}

void dir(const std::string& p, mode_t mode, uid_t uid = 0, gid_t gid = 0) {
  ASSERT_EQ(::mkdir(p.c_str(), 0755), 0);
  ASSERT_EQ(::chown(p.c_str(), uid, gid), 0);
  ASSERT_EQ(::chmod(p.c_str(), mode), 0);
}

int openFor(const std::string& p, int flags) {
  int fd = ::open(p.c_str(), flags, 0644);
  if (fd < 0) return errno;
  ::close(fd);
  return 0;
}

const PermCase kCases[] = {
    // Reading and writing files by owner / group / other bits.
    {"OwnerReadAllowed", [](auto& d) { file(d + "/f", 0400, kUser); },
     [](auto& d) { return openFor(d + "/f", O_RDONLY); }, 0},
    {"OwnerWriteDeniedWithoutWBit", [](auto& d) { file(d + "/f", 0400, kUser); },
     [](auto& d) { return openFor(d + "/f", O_WRONLY); }, EACCES},
    {"OwnerBitsWinOverOther", [](auto& d) { file(d + "/f", 0047, kUser); },
     [](auto& d) { return openFor(d + "/f", O_RDONLY); }, EACCES},
    {"GroupReadAllowed", [](auto& d) { file(d + "/f", 0040, 0, kUserGroup); },
     [](auto& d) { return openFor(d + "/f", O_RDONLY); }, 0},
    {"GroupWriteDenied", [](auto& d) { file(d + "/f", 0040, 0, kUserGroup); },
     [](auto& d) { return openFor(d + "/f", O_WRONLY); }, EACCES},
    {"SupplementaryGroupGrantsRead", [](auto& d) { file(d + "/f", 0040, 0, 4242); },
     [](auto& d) { return openFor(d + "/f", O_RDONLY); }, 0, 4242},
    {"NoGroupMeansOtherBits", [](auto& d) { file(d + "/f", 0040, 0, 4242); },
     [](auto& d) { return openFor(d + "/f", O_RDONLY); }, EACCES},
    {"OtherReadAllowed", [](auto& d) { file(d + "/f", 0604); },
     [](auto& d) { return openFor(d + "/f", O_RDONLY); }, 0},
    {"OtherReadDenied", [](auto& d) { file(d + "/f", 0600); },
     [](auto& d) { return openFor(d + "/f", O_RDONLY); }, EACCES},
    {"OtherWriteAllowed", [](auto& d) { file(d + "/f", 0602); },
     [](auto& d) { return openFor(d + "/f", O_WRONLY); }, 0},
    {"OtherWriteDenied", [](auto& d) { file(d + "/f", 0644); },
     [](auto& d) { return openFor(d + "/f", O_WRONLY); }, EACCES},
    {"ReadWriteNeedsBoth", [](auto& d) { file(d + "/f", 0604); },
     [](auto& d) { return openFor(d + "/f", O_RDWR); }, EACCES},
    {"TruncOpenNeedsWrite", [](auto& d) { file(d + "/f", 0644); },
     [](auto& d) { return openFor(d + "/f", O_RDONLY | O_TRUNC); }, EACCES},
    {"TruncateNeedsWrite", [](auto& d) { file(d + "/f", 0644); },
     [](auto& d) { return errnoOf(::truncate((d + "/f").c_str(), 0)); }, EACCES},
    {"TruncateWithWriteAllowed", [](auto& d) { file(d + "/f", 0646); },
     [](auto& d) { return errnoOf(::truncate((d + "/f").c_str(), 1)); }, 0},
    // Directories: search (x) on every component, write+search to change entries.
    {"SearchDeniedOnComponent",
     [](auto& d) {
       dir(d + "/s", 0700);
       file(d + "/s/f", 0644);
     },
     [](auto& d) { return openFor(d + "/s/f", O_RDONLY); }, EACCES},
    {"SearchDeniedOnStat",
     [](auto& d) {
       dir(d + "/s", 0700);
       file(d + "/s/f", 0644);
     },
     [](auto& d) {
       struct stat st;
       return errnoOf(::stat((d + "/s/f").c_str(), &st));
     },
     EACCES},
    {"SearchOnlyDirAllowsOpenByName",
     [](auto& d) {
       dir(d + "/s", 0711);
       file(d + "/s/f", 0644);
     },
     [](auto& d) { return openFor(d + "/s/f", O_RDONLY); }, 0},
    {"SearchOnlyDirDeniesListing", [](auto& d) { dir(d + "/s", 0711); },
     [](auto& d) {
       DIR* dd = ::opendir((d + "/s").c_str());
       if (!dd) return errno;
       ::closedir(dd);
       return 0;
     },
     EACCES},
    {"ReadableDirListing", [](auto& d) { dir(d + "/s", 0755); },
     [](auto& d) {
       DIR* dd = ::opendir((d + "/s").c_str());
       if (!dd) return errno;
       ::closedir(dd);
       return 0;
     },
     0},
    {"CreateInReadOnlyDirDenied", [](auto& d) { dir(d + "/s", 0755); },
     [](auto& d) { return openFor(d + "/s/new", O_CREAT | O_WRONLY); }, EACCES},
    {"CreateInWritableDirAllowed", [](auto& d) { dir(d + "/s", 0777); },
     [](auto& d) { return openFor(d + "/s/new", O_CREAT | O_WRONLY); }, 0},
    {"CreateNeedsSearchToo", [](auto& d) { dir(d + "/s", 0776); },
     [](auto& d) { return openFor(d + "/s/new", O_CREAT | O_WRONLY); }, EACCES},
    {"MkdirInReadOnlyDirDenied", [](auto& d) { dir(d + "/s", 0755); },
     [](auto& d) { return errnoOf(::mkdir((d + "/s/x").c_str(), 0755)); }, EACCES},
    {"UnlinkInReadOnlyDirDenied",
     [](auto& d) {
       dir(d + "/s", 0755);
       file(d + "/s/f", 0666);
     },
     [](auto& d) { return errnoOf(::unlink((d + "/s/f").c_str())); }, EACCES},
    {"UnlinkOfReadOnlyFileInWritableDirAllowed",
     [](auto& d) {
       dir(d + "/s", 0777);
       file(d + "/s/f", 0400);
     },
     [](auto& d) { return errnoOf(::unlink((d + "/s/f").c_str())); }, 0},
    {"RmdirInReadOnlyDirDenied",
     [](auto& d) {
       dir(d + "/s", 0755);
       dir(d + "/s/e", 0777);
     },
     [](auto& d) { return errnoOf(::rmdir((d + "/s/e").c_str())); }, EACCES},
    {"RenameOutOfReadOnlyDirDenied",
     [](auto& d) {
       dir(d + "/s", 0755);
       file(d + "/s/f", 0666);
       dir(d + "/t", 0777);
     },
     [](auto& d) { return errnoOf(::rename((d + "/s/f").c_str(), (d + "/t/f").c_str())); }, EACCES},
    {"RenameIntoReadOnlyDirDenied",
     [](auto& d) {
       dir(d + "/s", 0777);
       file(d + "/s/f", 0666, kUser);
       dir(d + "/t", 0755);
     },
     [](auto& d) { return errnoOf(::rename((d + "/s/f").c_str(), (d + "/t/f").c_str())); }, EACCES},
    {"RenameBetweenWritableDirsAllowed",
     [](auto& d) {
       dir(d + "/s", 0777);
       file(d + "/s/f", 0666);
       dir(d + "/t", 0777);
     },
     [](auto& d) { return errnoOf(::rename((d + "/s/f").c_str(), (d + "/t/f").c_str())); }, 0},
    {"LinkIntoReadOnlyDirDenied",
     [](auto& d) {
       file(d + "/f", 0666, kUser);
       dir(d + "/t", 0755);
     },
     [](auto& d) { return errnoOf(::link((d + "/f").c_str(), (d + "/t/l").c_str())); }, EACCES},
    {"SymlinkInReadOnlyDirDenied", [](auto& d) { dir(d + "/t", 0755); },
     [](auto& d) { return errnoOf(::symlink("x", (d + "/t/l").c_str())); }, EACCES},
    // Sticky directories: only the owner of the entry or of the directory removes it.
    {"StickyDirOthersFileUnlinkDenied",
     [](auto& d) {
       dir(d + "/tmp", 01777);
       file(d + "/tmp/f", 0666, kOther, kOtherGroup);
     },
     [](auto& d) { return errnoOf(::unlink((d + "/tmp/f").c_str())); }, EPERM},
    {"StickyDirOwnFileUnlinkAllowed",
     [](auto& d) {
       dir(d + "/tmp", 01777);
       file(d + "/tmp/f", 0600, kUser, kUserGroup);
     },
     [](auto& d) { return errnoOf(::unlink((d + "/tmp/f").c_str())); }, 0},
    {"StickyDirOwnerOfDirMayUnlink",
     [](auto& d) {
       dir(d + "/tmp", 01777, kUser);
       file(d + "/tmp/f", 0666, kOther, kOtherGroup);
     },
     [](auto& d) { return errnoOf(::unlink((d + "/tmp/f").c_str())); }, 0},
    {"StickyDirOthersFileRenameDenied",
     [](auto& d) {
       dir(d + "/tmp", 01777);
       file(d + "/tmp/f", 0666, kOther, kOtherGroup);
     },
     [](auto& d) { return errnoOf(::rename((d + "/tmp/f").c_str(), (d + "/tmp/g").c_str())); },
     EPERM},
    {"StickyDirReplaceOthersFileDenied",
     [](auto& d) {
       dir(d + "/tmp", 01777);
       file(d + "/tmp/mine", 0666, kUser, kUserGroup);
       file(d + "/tmp/theirs", 0666, kOther, kOtherGroup);
     },
     [](auto& d) {
       return errnoOf(::rename((d + "/tmp/mine").c_str(), (d + "/tmp/theirs").c_str()));
     },
     EPERM},
    // Attributes: only the owner (or root) changes mode, times; chown is root's.
    {"ChmodByOwnerAllowed", [](auto& d) { file(d + "/f", 0600, kUser, kUserGroup); },
     [](auto& d) { return errnoOf(::chmod((d + "/f").c_str(), 0640)); }, 0},
    {"ChmodByNonOwnerDenied", [](auto& d) { file(d + "/f", 0666); },
     [](auto& d) { return errnoOf(::chmod((d + "/f").c_str(), 0777)); }, EPERM},
    {"ChownToOtherUserDenied", [](auto& d) { file(d + "/f", 0666, kUser, kUserGroup); },
     [](auto& d) { return errnoOf(::chown((d + "/f").c_str(), kOther, -1)); }, EPERM},
    {"ChownOfOthersFileDenied", [](auto& d) { file(d + "/f", 0666); },
     [](auto& d) { return errnoOf(::chown((d + "/f").c_str(), kUser, -1)); }, EPERM},
    {"ChgrpToOwnGroupAllowed", [](auto& d) { file(d + "/f", 0666, kUser, 0); },
     [](auto& d) { return errnoOf(::chown((d + "/f").c_str(), -1, kUserGroup)); }, 0},
    {"ChgrpToForeignGroupDenied", [](auto& d) { file(d + "/f", 0666, kUser, kUserGroup); },
     [](auto& d) { return errnoOf(::chown((d + "/f").c_str(), -1, kOtherGroup)); }, EPERM},
    {"ChgrpToSupplementaryGroupAllowed", [](auto& d) { file(d + "/f", 0666, kUser, kUserGroup); },
     [](auto& d) { return errnoOf(::chown((d + "/f").c_str(), -1, 4343)); }, 0, 4343},
    {"UtimesExplicitByNonOwnerDenied", [](auto& d) { file(d + "/f", 0666); },
     [](auto& d) {
       timespec ts[2] = {{1, 0}, {1, 0}};
       return errnoOf(::utimensat(AT_FDCWD, (d + "/f").c_str(), ts, 0));
     },
     EPERM},
    {"UtimesNowWithWriteAccessAllowed", [](auto& d) { file(d + "/f", 0666); },
     [](auto& d) { return errnoOf(::utimensat(AT_FDCWD, (d + "/f").c_str(), nullptr, 0)); }, 0},
    {"UtimesNowWithoutWriteAccessDenied", [](auto& d) { file(d + "/f", 0644); },
     [](auto& d) { return errnoOf(::utimensat(AT_FDCWD, (d + "/f").c_str(), nullptr, 0)); },
     EACCES},
    {"UtimesByOwnerAllowed", [](auto& d) { file(d + "/f", 0400, kUser); },
     [](auto& d) {
       timespec ts[2] = {{5, 0}, {5, 0}};
       return errnoOf(::utimensat(AT_FDCWD, (d + "/f").c_str(), ts, 0));
     },
     0},
    // access(2) answers with the same rules.
    {"AccessReadGranted", [](auto& d) { file(d + "/f", 0604); },
     [](auto& d) { return errnoOf(::access((d + "/f").c_str(), R_OK)); }, 0},
    {"AccessWriteDenied", [](auto& d) { file(d + "/f", 0604); },
     [](auto& d) { return errnoOf(::access((d + "/f").c_str(), W_OK)); }, EACCES},
    {"AccessExecDenied", [](auto& d) { file(d + "/f", 0644); },
     [](auto& d) { return errnoOf(::access((d + "/f").c_str(), X_OK)); }, EACCES},
    {"AccessExecGranted", [](auto& d) { file(d + "/f", 0755); },
     [](auto& d) { return errnoOf(::access((d + "/f").c_str(), X_OK)); }, 0},
    // Extended attributes: user.* follow the file's read/write permission.
    {"XattrSetNeedsWrite", [](auto& d) { file(d + "/f", 0644); },
     [](auto& d) { return errnoOf(::setxattr((d + "/f").c_str(), "user.a", "1", 1, 0)); }, EACCES},
    {"XattrGetNeedsRead",
     [](auto& d) {
       file(d + "/f", 0644);
       ASSERT_EQ(::setxattr((d + "/f").c_str(), "user.a", "1", 1, 0), 0);
       ASSERT_EQ(::chmod((d + "/f").c_str(), 0600), 0);
     },
     [](auto& d) {
       char b[4];
       return errnoOf(::getxattr((d + "/f").c_str(), "user.a", b, sizeof b));
     },
     EACCES},
    {"XattrSetByWriterAllowed", [](auto& d) { file(d + "/f", 0666); },
     [](auto& d) { return errnoOf(::setxattr((d + "/f").c_str(), "user.a", "1", 1, 0)); }, 0},
    {"TrustedXattrNeedsRoot", [](auto& d) { file(d + "/f", 0666, kUser); },
     [](auto& d) { return errnoOf(::setxattr((d + "/f").c_str(), "trusted.a", "1", 1, 0)); },
     EPERM},
    // Writing through an open descriptor was decided at open.
    {"WriteAfterChmodStillAllowedOnOpenFd", [](auto& d) { file(d + "/f", 0666); },
     [](auto& d) {
       int fd = ::open((d + "/f").c_str(), O_WRONLY);
       if (fd < 0) return errno;
       int rc = ::write(fd, "x", 1) == 1 ? 0 : errno;
       ::close(fd);
       return rc;
     },
     0},
    // Root-owned root directory: no creating there.
    {"CreateInMountRootDenied", [](auto&) {},
     [](auto&) {
       return openFor(MountEnv::get().mnt() + "/user-file-in-root", O_CREAT | O_WRONLY);
     },
     EACCES},
    {"ExecOfNonExecutableDenied", [](auto& d) { file(d + "/prog", 0644); },
     [](auto& d) {
       char* argv[] = {const_cast<char*>("prog"), nullptr};
       ::execv((d + "/prog").c_str(), argv);
       return errno;
     },
     EACCES},
};

void PrintTo(const PermCase& c, std::ostream* os) { *os << c.name; }

class Permission : public ::testing::TestWithParam<PermCase> {};

TEST_P(Permission, AsUnprivilegedUser) {
  const PermCase& c = GetParam();
  std::string d = testDir();
  c.setup(d);
  if (HasFatalFailure()) return;
  int got = asUser(
      kUser, kUserGroup, [&] { return c.step(d); }, c.extra_group);
  EXPECT_EQ(got, c.want) << c.name << ": got " << std::strerror(got) << ", want "
                         << std::strerror(c.want);
}

INSTANTIATE_TEST_SUITE_P(Posix, Permission, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// A denied call leaves the file as it was.
TEST(PermissionExtra, FailedCallsChangeNothing) {
  std::string d = testDir();
  file(d + "/f", 0644);
  EXPECT_EQ(asUser(kUser, kUserGroup, [&] { return errnoOf(::unlink((d + "/f").c_str())); }), 0);
  file(d + "/g", 0600);
  EXPECT_EQ(asUser(kUser, kUserGroup, [&] { return openFor(d + "/g", O_WRONLY | O_TRUNC); }),
            EACCES);
  EXPECT_EQ(readFile(d + "/g"), "data");
  EXPECT_EQ(asUser(kUser, kUserGroup, [&] { return errnoOf(::chmod((d + "/g").c_str(), 0777)); }),
            EPERM);
  struct stat st;
  ASSERT_EQ(::stat((d + "/g").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

// The same for a file whose bytes are in chunks (past the 8 KiB that stay
// inline): a truncate cuts storage before it commits, so the permission
// check must come before the cut (ClientImpl::cutForTruncate).
TEST(PermissionExtra, DeniedTruncatesLeaveAChunkedFilesBytes) {
  std::string d = testDir();
  std::string big(100 << 10, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + i % 23);
  ASSERT_TRUE(writeFile(d + "/f", big, 0644));
  ASSERT_TRUE(writeFile(d + "/g", big, 0602));  // the user may write it, not read it
  ASSERT_EQ(::chmod((d + "/g").c_str(), 0602), 0);
  EXPECT_EQ(asUser(kUser, kUserGroup, [&] { return errnoOf(::truncate((d + "/f").c_str(), 1)); }),
            EACCES);
  EXPECT_EQ(asUser(kUser, kUserGroup, [&] { return openFor(d + "/f", O_WRONLY | O_TRUNC); }),
            EACCES);
  EXPECT_EQ(asUser(kUser, kUserGroup, [&] { return openFor(d + "/g", O_RDWR | O_TRUNC); }), EACCES);
  EXPECT_EQ(readFile(d + "/f"), big);
  EXPECT_EQ(readFile(d + "/g"), big);
}

// Through the page cache (the kernel clears the bits with a chmod of its
// own) and past it (write-only and O_DIRECT descriptors: the mount clears them).
TEST(PermissionExtra, WriteBySomeoneElseClearsSetuidAndSetgid) {
  std::string d = testDir();
  for (int flags : {O_RDWR | O_APPEND, O_WRONLY | O_APPEND, O_RDWR | O_APPEND | O_DIRECT}) {
    SCOPED_TRACE(flags);
    file(d + "/prog", 06777);
    EXPECT_EQ(asUser(kUser, kUserGroup,
                     [&] {
                       int fd = ::open((d + "/prog").c_str(), flags);
                       if (fd < 0) return errno;
                       int rc = ::write(fd, "more", 4) == 4 ? 0 : errno;
                       ::close(fd);
                       return rc;
                     }),
              0);
    struct stat st;
    ASSERT_EQ(::stat((d + "/prog").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0777u);
    EXPECT_EQ(readFile(d + "/prog"), "datamore");
    // A chmod by the same user is still refused.
    EXPECT_EQ(
        asUser(kUser, kUserGroup, [&] { return errnoOf(::chmod((d + "/prog").c_str(), 0700)); }),
        EPERM);
    ASSERT_EQ(::unlink((d + "/prog").c_str()), 0);
  }
}

// The same when the writer made the file itself and writes through the
// write-only descriptor that created it (the kernel leaves the clearing to
// the mount there); root's writes keep the bits, as on a local disk.
TEST(PermissionExtra, WritesThroughTheCreatingDescriptorClearSetuidAndSetgid) {
  std::string d = testDir();
  auto createAndWrite = [&](const std::string& path) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0755);
    if (fd < 0) return errno;
    struct stat st;
    int rc = ::fchmod(fd, 06755) == 0 && ::fstat(fd, &st) == 0 ? 0 : errno;
    if (rc == 0 && (st.st_mode & 07777) != 06755) rc = EINVAL;  // the bits never got there
    if (rc == 0) rc = ::write(fd, "data", 4) == 4 ? 0 : errno;
    if (rc == 0) rc = ::write(fd, "more", 4) == 4 ? 0 : errno;
    ::close(fd);
    return rc;
  };
  EXPECT_EQ(asUser(kUser, kUserGroup, [&] { return createAndWrite(d + "/users"); }), 0);
  struct stat st;
  ASSERT_EQ(::stat((d + "/users").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  EXPECT_EQ(st.st_uid, kUser);
  EXPECT_EQ(readFile(d + "/users"), "datamore");
  ASSERT_EQ(createAndWrite(d + "/roots"), 0);
  ASSERT_EQ(::stat((d + "/roots").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 06755u);
  EXPECT_EQ(readFile(d + "/roots"), "datamore");
}

TEST(PermissionExtra, FilesCreatedByUserAreTheirs) {
  std::string d = testDir();
  EXPECT_EQ(asUser(kUser, kUserGroup,
                   [&] {
                     if (!writeFile(d + "/mine", "m")) return errno;
                     return errnoOf(::mkdir((d + "/mydir").c_str(), 0700));
                   }),
            0);
  struct stat st;
  ASSERT_EQ(::stat((d + "/mine").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kUser);
  EXPECT_EQ(st.st_gid, kUserGroup);
  ASSERT_EQ(::stat((d + "/mydir").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kUser);
}

TEST(PermissionExtra, SetgidDirectoryPassesItsGroupOn) {
  std::string d = testDir();
  dir(d + "/g", 02777, 0, 4545);
  EXPECT_EQ(asUser(kUser, kUserGroup, [&] { return writeFile(d + "/g/f", "x") ? 0 : errno; }), 0);
  struct stat st;
  ASSERT_EQ(::stat((d + "/g/f").c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, 4545u);
}

}  // namespace
}  // namespace cistern::testing
