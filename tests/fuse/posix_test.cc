// The POSIX behaviour suite of the FUSE mount: every operation with its
// error cases, run against a real `cistern up --mount` as root, with
// permission cases run as unprivileged users in child processes.
#include <dirent.h>
#include <linux/capability.h>
#include <linux/falloc.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/xattr.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "tests/fuse/mount_env.h"
#include "tests/support/http_get.h"

namespace cistern::testing {
namespace {

struct stat statOf(const std::string& p) {
  struct stat st;
  std::memset(&st, 0, sizeof(st));
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p << ": " << std::strerror(errno);
  return st;
}

bool exists(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

std::set<std::string> listDir(const std::string& p) {
  std::set<std::string> names;
  DIR* d = ::opendir(p.c_str());
  EXPECT_NE(d, nullptr) << p;
  if (!d) return names;
  while (dirent* e = ::readdir(d)) names.insert(e->d_name);
  ::closedir(d);
  return names;
}

std::string pattern(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  std::mt19937 rng(seed);
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

// --- create, open, read, write -------------------------------------------

TEST(Files, CreateWriteReadBack) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "hello world"));
  EXPECT_EQ(readFile(d + "/f"), "hello world");
  EXPECT_EQ(statOf(d + "/f").st_size, 11);
}

TEST(Files, EmptyFile) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/e", ""));
  EXPECT_EQ(statOf(d + "/e").st_size, 0);
  EXPECT_EQ(readFile(d + "/e"), "");
}

TEST(Files, CreateModeHonoursUmaskAndType) {
  auto d = testDir();
  mode_t old = ::umask(022);
  int fd = ::open((d + "/f").c_str(), O_CREAT | O_WRONLY, 0666);
  ::umask(old);
  ASSERT_GE(fd, 0);
  ::close(fd);
  auto st = statOf(d + "/f");
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  EXPECT_EQ(st.st_nlink, 1u);
  EXPECT_EQ(st.st_uid, 0u);
}

TEST(Files, OpenMissingIsENOENT) {
  auto d = testDir();
  EXPECT_ERRNO(::open((d + "/missing").c_str(), O_RDONLY), ENOENT);
}

TEST(Files, OpenInMissingDirIsENOENT) {
  auto d = testDir();
  EXPECT_ERRNO(::open((d + "/nodir/f").c_str(), O_CREAT | O_WRONLY, 0644), ENOENT);
}

TEST(Files, OpenThroughFileIsENOTDIR) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  EXPECT_ERRNO(::open((d + "/f/g").c_str(), O_RDONLY), ENOTDIR);
  EXPECT_ERRNO(::open((d + "/f/g").c_str(), O_CREAT | O_WRONLY, 0644), ENOTDIR);
}

TEST(Files, OpenExclusiveOnExistingIsEEXIST) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "keep"));
  EXPECT_ERRNO(::open((d + "/f").c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644), EEXIST);
  EXPECT_EQ(readFile(d + "/f"), "keep");
}

TEST(Files, OpenCreateWithoutExclOpensExisting) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "keep"));
  int fd = ::open((d + "/f").c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  char buf[8] = {};
  EXPECT_EQ(::read(fd, buf, sizeof buf), 4);
  ::close(fd);
  EXPECT_EQ(statOf(d + "/f").st_mode & 0777, 0644u);  // mode of a new file only
}

TEST(Files, OpenDirectoryForWriteIsEISDIR) {
  auto d = testDir();
  EXPECT_ERRNO(::open(d.c_str(), O_WRONLY), EISDIR);
  EXPECT_ERRNO(::open(d.c_str(), O_RDWR), EISDIR);
}

TEST(Files, OpenDirectoryFlagOnFileIsENOTDIR) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  EXPECT_ERRNO(::open((d + "/f").c_str(), O_RDONLY | O_DIRECTORY), ENOTDIR);
}

TEST(Files, CreateOverDirectoryIsEISDIR) {
  auto d = testDir();
  ASSERT_EQ(::mkdir((d + "/sub").c_str(), 0755), 0);
  EXPECT_ERRNO(::open((d + "/sub").c_str(), O_CREAT | O_WRONLY, 0644), EISDIR);
}

TEST(Files, TruncOnOpenDropsOldContents) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", std::string(100000, 'a')));
  int fd = ::open((d + "/f").c_str(), O_WRONLY | O_TRUNC);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(statOf(d + "/f").st_size, 0);
  ASSERT_EQ(::pwrite(fd, "b", 1, 50000), 1);  // a hole where the old bytes were
  ::close(fd);
  std::string got = readFile(d + "/f");
  ASSERT_EQ(got.size(), 50001u);
  EXPECT_EQ(got.find('a'), std::string::npos);
  EXPECT_EQ(got[50000], 'b');
}

TEST(Files, AppendWritesAtTheEnd) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "abc"));
  int fd = ::open((d + "/f").c_str(), O_WRONLY | O_APPEND);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "def", 3), 3);
  ASSERT_EQ(::pwrite(fd, "gh", 2, 0), 2);  // Linux: O_APPEND ignores the offset
  ::close(fd);
  EXPECT_EQ(readFile(d + "/f"), "abcdefgh");
}

TEST(Files, ReadOnWriteOnlyIsEBADF) {
  auto d = testDir();
  int fd = ::open((d + "/f").c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  char c;
  EXPECT_ERRNO(::read(fd, &c, 1), EBADF);
  ::close(fd);
}

TEST(Files, WriteOnReadOnlyIsEBADF) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  int fd = ::open((d + "/f").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_ERRNO(::write(fd, "y", 1), EBADF);
  ::close(fd);
  EXPECT_EQ(readFile(d + "/f"), "x");
}

TEST(Files, ReadPastEndReturnsZero) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "abc"));
  int fd = ::open((d + "/f").c_str(), O_RDONLY);
  char buf[4];
  EXPECT_EQ(::pread(fd, buf, 4, 3), 0);
  EXPECT_EQ(::pread(fd, buf, 4, 1000), 0);
  EXPECT_EQ(::pread(fd, buf, 4, 1), 2);
  ::close(fd);
}

TEST(Files, OverwriteInTheMiddle) {
  auto d = testDir();
  std::string data = pattern(3 << 20, 1);
  ASSERT_TRUE(writeFile(d + "/f", data));
  int fd = ::open((d + "/f").c_str(), O_WRONLY);
  std::string patch = pattern(200000, 2);
  ASSERT_EQ(::pwrite(fd, patch.data(), patch.size(), (1 << 20) - 100000),
            static_cast<ssize_t>(patch.size()));
  ::close(fd);
  data.replace((1 << 20) - 100000, patch.size(), patch);
  EXPECT_TRUE(readFile(d + "/f") == data);
}

TEST(Files, LargeFileRoundTrip) {
  auto d = testDir();
  std::string data = pattern(9 << 20 | 12345, 3);
  ASSERT_TRUE(writeFile(d + "/big", data));
  EXPECT_EQ(statOf(d + "/big").st_size, static_cast<off_t>(data.size()));
  EXPECT_TRUE(readFile(d + "/big") == data);
}

TEST(Files, UnalignedSmallWritesCoalesce) {
  auto d = testDir();
  int fd = ::open((d + "/f").c_str(), O_CREAT | O_WRONLY, 0644);
  std::string all;
  for (int i = 0; i < 3000; ++i) {
    std::string piece = pattern(777, static_cast<uint32_t>(i));
    ASSERT_EQ(::write(fd, piece.data(), piece.size()), 777);
    all += piece;
  }
  ::close(fd);
  EXPECT_TRUE(readFile(d + "/f") == all);
}

TEST(Files, WriteVisibleToAnotherDescriptorAtOnce) {
  auto d = testDir();
  int w = ::open((d + "/f").c_str(), O_CREAT | O_WRONLY, 0644);
  int r = ::open((d + "/f").c_str(), O_RDONLY);
  ASSERT_EQ(::write(w, "abcdef", 6), 6);
  char buf[8] = {};
  EXPECT_EQ(::pread(r, buf, 8, 0), 6);
  EXPECT_EQ(std::string(buf, 6), "abcdef");
  struct stat st;
  ASSERT_EQ(::fstat(r, &st), 0);
  EXPECT_EQ(st.st_size, 6);
  ::close(w);
  ::close(r);
}

TEST(Files, FsyncAndFdatasyncSucceed) {
  auto d = testDir();
  int fd = ::open((d + "/f").c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_EQ(::write(fd, "x", 1), 1);
  EXPECT_OK(::fsync(fd));
  EXPECT_OK(::fdatasync(fd));
  ::close(fd);
}

TEST(Files, DirectIoReadAndWrite) {
  auto d = testDir();
  int fd = ::open((d + "/f").c_str(), O_CREAT | O_RDWR | O_DIRECT, 0644);
  ASSERT_GE(fd, 0);
  void* buf = nullptr;
  ASSERT_EQ(posix_memalign(&buf, 4096, 1 << 20), 0);
  std::string data = pattern(1 << 20, 9);
  std::memcpy(buf, data.data(), data.size());
  EXPECT_EQ(::pwrite(fd, buf, 1 << 20, 0), 1 << 20);
  std::memset(buf, 0, 1 << 20);
  EXPECT_EQ(::pread(fd, buf, 1 << 20, 0), 1 << 20);
  EXPECT_EQ(std::memcmp(buf, data.data(), data.size()), 0);
  free(buf);
  ::close(fd);
}

TEST(Files, MknodRegularFileWorks) {
  auto d = testDir();
  EXPECT_OK(::mknod((d + "/r").c_str(), S_IFREG | 0640, 0));
  auto st = statOf(d + "/r");
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0640u);
}

TEST(Special, FifoCarriesDataThroughTheKernel) {
  auto d = testDir();
  std::string p = d + "/p";
  ASSERT_OK(::mkfifo(p.c_str(), 0640));
  auto st = statOf(p);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(st.st_size, 0);
  // No reader yet: a non-blocking write open is ENXIO, a read open succeeds.
  EXPECT_ERRNO(::open(p.c_str(), O_WRONLY | O_NONBLOCK), ENXIO);
  int r = ::open(p.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(r, 0) << std::strerror(errno);
  int w = ::open(p.c_str(), O_WRONLY);
  ASSERT_GE(w, 0) << std::strerror(errno);
  ASSERT_EQ(::write(w, "through", 7), 7);
  char buf[16] = {};
  EXPECT_EQ(::read(r, buf, sizeof buf), 7);
  EXPECT_STREQ(buf, "through");
  ::close(w);
  ::close(r);
  EXPECT_EQ(statOf(p).st_size, 0);  // the bytes never reached cistern
}

TEST(Special, UnixSocketBindsConnectsAndShowsAsASocket) {
  auto d = testDir();
  std::string path = d + "/s";
  int srv = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(srv, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof(addr.sun_path)) << path;
  std::strcpy(addr.sun_path, path.c_str());
  ASSERT_OK(::bind(srv, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)));
  ASSERT_OK(::listen(srv, 1));
  EXPECT_TRUE(S_ISSOCK(statOf(path).st_mode));
  int cli = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_OK(::connect(cli, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)));
  int conn = ::accept(srv, nullptr, nullptr);
  ASSERT_GE(conn, 0);
  ASSERT_EQ(::write(cli, "hi", 2), 2);
  char buf[4] = {};
  EXPECT_EQ(::read(conn, buf, sizeof buf), 2);
  ::close(conn);
  ::close(cli);
  ::close(srv);
  EXPECT_ERRNO(::open(path.c_str(), O_RDONLY), ENXIO);  // a socket is not opened
  // Binding over an existing name is EADDRINUSE, as on a local disk.
  int again = ::socket(AF_UNIX, SOCK_STREAM, 0);
  EXPECT_ERRNO(::bind(again, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), EADDRINUSE);
  ::close(again);
  EXPECT_OK(::unlink(path.c_str()));
}

TEST(Special, DeviceNodesKeepTheirNumberAndOpenTheDevice) {
  auto d = testDir();
  ASSERT_OK(::mknod((d + "/null").c_str(), S_IFCHR | 0666, makedev(1, 3)));
  ASSERT_OK(::mknod((d + "/blk").c_str(), S_IFBLK | 0600, makedev(7, 200)));
  auto c = statOf(d + "/null");
  EXPECT_TRUE(S_ISCHR(c.st_mode));
  EXPECT_EQ(major(c.st_rdev), 1u);
  EXPECT_EQ(minor(c.st_rdev), 3u);
  auto b = statOf(d + "/blk");
  EXPECT_TRUE(S_ISBLK(b.st_mode));
  EXPECT_EQ(b.st_rdev, makedev(7, 200));
  // The mount is dev (as a local disk mounted by root): the node opens /dev/null's driver.
  int fd = ::open((d + "/null").c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  EXPECT_EQ(::write(fd, "gone", 4), 4);
  char ch;
  EXPECT_EQ(::read(fd, &ch, 1), 0);
  ::close(fd);
  // readdir's d_type says what each is.
  std::map<std::string, unsigned char> types;
  DIR* dir = ::opendir(d.c_str());
  ASSERT_NE(dir, nullptr);
  while (dirent* e = ::readdir(dir)) types[e->d_name] = e->d_type;
  ::closedir(dir);
  EXPECT_EQ(types["null"], DT_CHR);
  EXPECT_EQ(types["blk"], DT_BLK);
}

TEST(Special, NodesLinkRenameChmodAndUnlink) {
  auto d = testDir();
  ASSERT_OK(::mkfifo((d + "/p").c_str(), 0600));
  ASSERT_OK(::link((d + "/p").c_str(), (d + "/p2").c_str()));
  EXPECT_EQ(statOf(d + "/p").st_nlink, 2u);
  ASSERT_OK(::rename((d + "/p2").c_str(), (d + "/q").c_str()));
  ASSERT_OK(::chmod((d + "/q").c_str(), 0604));
  EXPECT_EQ(statOf(d + "/p").st_mode & 07777, 0604u);
  ASSERT_OK(::chown((d + "/q").c_str(), 1000, 1000));
  EXPECT_EQ(statOf(d + "/p").st_uid, 1000u);
  EXPECT_ERRNO(::truncate((d + "/q").c_str(), 0), EINVAL);
  ASSERT_OK(::unlink((d + "/p").c_str()));
  ASSERT_OK(::unlink((d + "/q").c_str()));
  EXPECT_FALSE(exists(d + "/q"));
}

TEST(Files, FlockAndOfdLocksAreLocal) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  int fd = ::open((d + "/f").c_str(), O_RDWR);
  EXPECT_OK(::flock(fd, LOCK_EX));
  EXPECT_OK(::flock(fd, LOCK_UN));
  ::close(fd);
}

// --- sparse files and large offsets ------------------------------------------

TEST(Sparse, HolesReadAsZeros) {
  auto d = testDir();
  int fd = ::open((d + "/s").c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_EQ(::pwrite(fd, "end", 3, 5 << 20), 3);
  ::close(fd);
  std::string got = readFile(d + "/s");
  ASSERT_EQ(got.size(), (5u << 20) + 3);
  EXPECT_EQ(got.find_first_not_of('\0'), 5u << 20);
}

TEST(Sparse, OffsetBeyond4GiB) {
  auto d = testDir();
  int fd = ::open((d + "/s").c_str(), O_CREAT | O_RDWR, 0644);
  const off_t off = (off_t{5} << 30) + 12345;
  ASSERT_EQ(::pwrite(fd, "far", 3, off), 3);
  char buf[3];
  EXPECT_EQ(::pread(fd, buf, 3, off), 3);
  EXPECT_EQ(std::string(buf, 3), "far");
  EXPECT_EQ(::pread(fd, buf, 3, off - 3), 3);
  EXPECT_EQ(std::string(buf, 3), std::string(3, '\0'));
  ::close(fd);
  EXPECT_EQ(statOf(d + "/s").st_size, off + 3);
}

TEST(Sparse, TruncateBeyond4GiBAndBack) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/s", "abc"));
  EXPECT_OK(::truncate((d + "/s").c_str(), off_t{6} << 30));
  EXPECT_EQ(statOf(d + "/s").st_size, off_t{6} << 30);
  EXPECT_OK(::truncate((d + "/s").c_str(), 2));
  EXPECT_EQ(readFile(d + "/s"), "ab");
}

TEST(Sparse, SeekDataPastEndIsENXIO) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/s", "abc"));
  int fd = ::open((d + "/s").c_str(), O_RDONLY);
  EXPECT_EQ(::lseek(fd, 0, SEEK_END), 3);
  EXPECT_ERRNO(::lseek(fd, 10, SEEK_DATA), ENXIO);
  ::close(fd);
}

TEST(Sparse, FallocateExtendsTheLength) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "abc"));
  int fd = ::open((d + "/f").c_str(), O_RDWR);
  EXPECT_OK(::fallocate(fd, 0, 0, 3 << 20));
  EXPECT_EQ(statOf(d + "/f").st_size, 3 << 20);
  EXPECT_OK(::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 8 << 20));
  EXPECT_EQ(statOf(d + "/f").st_size, 3 << 20);
  EXPECT_OK(::fallocate(fd, 0, 0, 10));  // inside: nothing changes
  ASSERT_EQ(::pwrite(fd, "Z", 1, 2 << 20), 1);
  ::close(fd);
  std::string got = readFile(d + "/f");
  ASSERT_EQ(got.size(), 3u << 20);
  EXPECT_EQ(got.substr(0, 3), "abc");
  EXPECT_EQ(got[2 << 20], 'Z');
  EXPECT_EQ(got.find_first_not_of('\0', 3), 2u << 20);
}

TEST(Sparse, PunchHoleIsNotSupported) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", std::string(10000, 'q')));
  int fd = ::open((d + "/f").c_str(), O_RDWR);
  EXPECT_ERRNO(::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), EOPNOTSUPP);
  EXPECT_ERRNO(::fallocate(fd, 0, -1, 10), EINVAL);
  ::close(fd);
  EXPECT_EQ(readFile(d + "/f"), std::string(10000, 'q'));
}

// --- truncate and setattr -----------------------------------------------------

TEST(Setattr, TruncateDownAndUp) {
  auto d = testDir();
  std::string data = pattern(2 << 20, 5);
  ASSERT_TRUE(writeFile(d + "/f", data));
  EXPECT_OK(::truncate((d + "/f").c_str(), 1000));
  EXPECT_EQ(readFile(d + "/f"), data.substr(0, 1000));
  EXPECT_OK(::truncate((d + "/f").c_str(), 3 << 20));
  std::string got = readFile(d + "/f");
  ASSERT_EQ(got.size(), 3u << 20);
  EXPECT_EQ(got.substr(0, 1000), data.substr(0, 1000));
  EXPECT_EQ(got.find_first_not_of('\0', 1000), std::string::npos);  // no old bytes
}

TEST(Setattr, FtruncateOnOpenFileWithBufferedWrites) {
  auto d = testDir();
  int fd = ::open((d + "/f").c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_EQ(::write(fd, "0123456789", 10), 10);
  EXPECT_OK(::ftruncate(fd, 4));
  ASSERT_EQ(::write(fd, "X", 1), 1);  // at offset 10: a hole 4..9
  ::close(fd);
  EXPECT_EQ(readFile(d + "/f"), std::string("0123") + std::string(6, '\0') + "X");
}

TEST(Setattr, TruncateNegativeIsEINVAL) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "abc"));
  EXPECT_ERRNO(::truncate((d + "/f").c_str(), -1), EINVAL);
}

TEST(Setattr, TruncateDirectoryIsEISDIR) {
  auto d = testDir();
  EXPECT_ERRNO(::truncate(d.c_str(), 0), EISDIR);
}

TEST(Setattr, TruncateMissingIsENOENT) {
  auto d = testDir();
  EXPECT_ERRNO(::truncate((d + "/nope").c_str(), 0), ENOENT);
}

TEST(Setattr, ChmodChangesModeAndCtime) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  auto before = statOf(d + "/f");
  usleep(20000);
  EXPECT_OK(::chmod((d + "/f").c_str(), 04751));
  auto after = statOf(d + "/f");
  EXPECT_EQ(after.st_mode & 07777, 04751u);
  EXPECT_GT(after.st_ctim.tv_sec * 1000000000L + after.st_ctim.tv_nsec,
            before.st_ctim.tv_sec * 1000000000L + before.st_ctim.tv_nsec);
}

TEST(Setattr, ChownByRoot) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  EXPECT_OK(::chown((d + "/f").c_str(), kUser, kUserGroup));
  auto st = statOf(d + "/f");
  EXPECT_EQ(st.st_uid, kUser);
  EXPECT_EQ(st.st_gid, kUserGroup);
  EXPECT_OK(::lchown((d + "/f").c_str(), static_cast<uid_t>(-1), 0));
  EXPECT_EQ(statOf(d + "/f").st_uid, kUser);
  EXPECT_EQ(statOf(d + "/f").st_gid, 0u);
}

TEST(Setattr, UtimensSetsTimes) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  timespec ts[2] = {{1000000000, 123}, {1200000000, 456789}};
  EXPECT_OK(::utimensat(AT_FDCWD, (d + "/f").c_str(), ts, 0));
  auto st = statOf(d + "/f");
  EXPECT_EQ(st.st_atim.tv_sec, 1000000000);
  EXPECT_EQ(st.st_atim.tv_nsec, 123);
  EXPECT_EQ(st.st_mtim.tv_sec, 1200000000);
  EXPECT_EQ(st.st_mtim.tv_nsec, 456789);
}

TEST(Setattr, UtimensNowAndOmit) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  timespec old[2] = {{1000, 0}, {2000, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, (d + "/f").c_str(), old, 0), 0);
  timespec ts[2] = {{0, UTIME_OMIT}, {0, UTIME_NOW}};
  EXPECT_OK(::utimensat(AT_FDCWD, (d + "/f").c_str(), ts, 0));
  auto st = statOf(d + "/f");
  EXPECT_EQ(st.st_atim.tv_sec, 1000);
  EXPECT_GT(st.st_mtim.tv_sec, time(nullptr) - 60);
}

TEST(Setattr, WriteUpdatesMtime) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  timespec old[2] = {{1000, 0}, {1000, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, (d + "/f").c_str(), old, 0), 0);
  ASSERT_TRUE(writeFile(d + "/f", "y"));
  EXPECT_GT(statOf(d + "/f").st_mtim.tv_sec, 1000);
}

TEST(Setattr, ChmodMissingIsENOENT) {
  auto d = testDir();
  EXPECT_ERRNO(::chmod((d + "/none").c_str(), 0644), ENOENT);
}

// --- directories ----------------------------------------------------------------

TEST(Dirs, MkdirAndStat) {
  auto d = testDir();
  EXPECT_OK(::mkdir((d + "/sub").c_str(), 0750));
  auto st = statOf(d + "/sub");
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0750u);
}

TEST(Dirs, MkdirExistingIsEEXIST) {
  auto d = testDir();
  ASSERT_EQ(::mkdir((d + "/sub").c_str(), 0755), 0);
  EXPECT_ERRNO(::mkdir((d + "/sub").c_str(), 0755), EEXIST);
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  EXPECT_ERRNO(::mkdir((d + "/f").c_str(), 0755), EEXIST);
}

TEST(Dirs, MkdirMissingParentIsENOENT) {
  auto d = testDir();
  EXPECT_ERRNO(::mkdir((d + "/a/b").c_str(), 0755), ENOENT);
}

TEST(Dirs, MkdirUnderFileIsENOTDIR) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  EXPECT_ERRNO(::mkdir((d + "/f/sub").c_str(), 0755), ENOTDIR);
}

TEST(Dirs, RmdirEmpty) {
  auto d = testDir();
  ASSERT_EQ(::mkdir((d + "/sub").c_str(), 0755), 0);
  EXPECT_OK(::rmdir((d + "/sub").c_str()));
  EXPECT_FALSE(exists(d + "/sub"));
}

TEST(Dirs, RmdirNonEmptyIsENOTEMPTY) {
  auto d = testDir();
  ASSERT_EQ(::mkdir((d + "/sub").c_str(), 0755), 0);
  ASSERT_TRUE(writeFile(d + "/sub/f", "x"));
  EXPECT_ERRNO(::rmdir((d + "/sub").c_str()), ENOTEMPTY);
  EXPECT_EQ(readFile(d + "/sub/f"), "x");
}

TEST(Dirs, RmdirFileIsENOTDIR) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  EXPECT_ERRNO(::rmdir((d + "/f").c_str()), ENOTDIR);
}

TEST(Dirs, RmdirMissingIsENOENT) {
  auto d = testDir();
  EXPECT_ERRNO(::rmdir((d + "/none").c_str()), ENOENT);
}

TEST(Dirs, RmdirDotIsEINVAL) {
  auto d = testDir();
  ASSERT_EQ(::mkdir((d + "/sub").c_str(), 0755), 0);
  EXPECT_ERRNO(::rmdir((d + "/sub/.").c_str()), EINVAL);
}

TEST(Dirs, UnlinkDirectoryIsEISDIR) {
  auto d = testDir();
  ASSERT_EQ(::mkdir((d + "/sub").c_str(), 0755), 0);
  EXPECT_ERRNO(::unlink((d + "/sub").c_str()), EISDIR);
}

TEST(Dirs, ReaddirListsEverythingWithDots) {
  auto d = testDir();
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(writeFile(d + "/f" + std::to_string(i), "x"));
  ASSERT_EQ(::mkdir((d + "/sub").c_str(), 0755), 0);
  auto names = listDir(d);
  EXPECT_EQ(names.size(), 23u);
  EXPECT_TRUE(names.count("."));
  EXPECT_TRUE(names.count(".."));
  EXPECT_TRUE(names.count("sub"));
  EXPECT_TRUE(names.count("f19"));
}

TEST(Dirs, ReaddirReportsTypes) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  ASSERT_EQ(::mkdir((d + "/sub").c_str(), 0755), 0);
  ASSERT_EQ(::symlink("f", (d + "/l").c_str()), 0);
  DIR* dir = ::opendir(d.c_str());
  std::map<std::string, int> types;
  while (dirent* e = ::readdir(dir)) types[e->d_name] = e->d_type;
  ::closedir(dir);
  EXPECT_EQ(types["f"], DT_REG);
  EXPECT_EQ(types["sub"], DT_DIR);
  EXPECT_EQ(types["l"], DT_LNK);
}

TEST(Dirs, ReaddirOfThousandsPagesCompletely) {
  auto d = testDir();
  const int n = 1500;
  for (int i = 0; i < n; ++i) {
    int fd = ::open((d + "/" + std::to_string(i)).c_str(), O_CREAT | O_WRONLY, 0644);
    ASSERT_GE(fd, 0);
    ::close(fd);
  }
  auto names = listDir(d);
  EXPECT_EQ(names.size(), static_cast<size_t>(n + 2));
  for (int i = 0; i < n; ++i) ASSERT_TRUE(names.count(std::to_string(i))) << i;
}

TEST(Dirs, RewinddirRestarts) {
  auto d = testDir();
  for (int i = 0; i < 700; ++i) ASSERT_TRUE(writeFile(d + "/f" + std::to_string(i), ""));
  DIR* dir = ::opendir(d.c_str());
  int first = 0;
  while (::readdir(dir)) ++first;
  ::rewinddir(dir);
  int second = 0;
  while (::readdir(dir)) ++second;
  ::closedir(dir);
  EXPECT_EQ(first, 702);
  EXPECT_EQ(second, 702);
}

TEST(Dirs, SeekdirToASavedPosition) {
  auto d = testDir();
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(writeFile(d + "/f" + std::to_string(i), ""));
  DIR* dir = ::opendir(d.c_str());
  for (int i = 0; i < 10; ++i) ASSERT_NE(::readdir(dir), nullptr);
  long pos = ::telldir(dir);
  std::string next = ::readdir(dir)->d_name;
  for (int i = 0; i < 5; ++i) ::readdir(dir);
  ::seekdir(dir, pos);
  dirent* again = ::readdir(dir);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(next, again->d_name);
  ::closedir(dir);
}

TEST(Dirs, OpendirOnFileIsENOTDIR) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  errno = 0;
  EXPECT_EQ(::opendir((d + "/f").c_str()), nullptr);
  EXPECT_EQ(errno, ENOTDIR);
}

TEST(Dirs, DeepTree) {
  auto d = testDir();
  std::string p = d;
  for (int i = 0; i < 40; ++i) {
    p += "/d" + std::to_string(i);
    ASSERT_EQ(::mkdir(p.c_str(), 0755), 0) << p;
  }
  ASSERT_TRUE(writeFile(p + "/leaf", "deep"));
  EXPECT_EQ(readFile(p + "/leaf"), "deep");
}

TEST(Dirs, ChdirAndRelativePaths) {
  auto d = testDir();
  ASSERT_EQ(::mkdir((d + "/sub").c_str(), 0755), 0);
  char old[PATH_MAX];
  ASSERT_NE(::getcwd(old, sizeof old), nullptr);
  ASSERT_EQ(::chdir((d + "/sub").c_str()), 0);
  EXPECT_TRUE(writeFile("rel", "r"));
  EXPECT_EQ(readFile("../sub/rel"), "r");
  ASSERT_EQ(::chdir(old), 0);
  EXPECT_EQ(readFile(d + "/sub/rel"), "r");
}

// --- names ------------------------------------------------------------------------

TEST(Names, LongestNameWorks) {
  auto d = testDir();
  std::string name(255, 'n');
  EXPECT_TRUE(writeFile(d + "/" + name, "x"));
  EXPECT_TRUE(exists(d + "/" + name));
}

TEST(Names, TooLongNameIsENAMETOOLONG) {
  auto d = testDir();
  std::string name(256, 'n');
  EXPECT_ERRNO(::open((d + "/" + name).c_str(), O_CREAT | O_WRONLY, 0644), ENAMETOOLONG);
  EXPECT_ERRNO(::mkdir((d + "/" + name).c_str(), 0755), ENAMETOOLONG);
}

TEST(Names, AnyBytesButSlashAndNul) {
  auto d = testDir();
  std::string name = "sp ace\t\x01\xff\xfe-ünï";
  EXPECT_TRUE(writeFile(d + "/" + name, "x"));
  EXPECT_TRUE(listDir(d).count(name));
}

TEST(Names, DotAndDotDotResolve) {
  auto d = testDir();
  ASSERT_EQ(::mkdir((d + "/a").c_str(), 0755), 0);
  ASSERT_TRUE(writeFile(d + "/a/f", "x"));
  EXPECT_EQ(readFile(d + "/a/./f"), "x");
  EXPECT_EQ(readFile(d + "/a/../a/f"), "x");
  EXPECT_EQ(statOf(d + "/a/..").st_ino, statOf(d).st_ino);
}

TEST(Names, MkdirDotIsEEXIST) {
  auto d = testDir();
  EXPECT_ERRNO(::mkdir((d + "/.").c_str(), 0755), EEXIST);
}

// --- unlink ---------------------------------------------------------------------

TEST(Unlink, RemovesTheName) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  EXPECT_OK(::unlink((d + "/f").c_str()));
  EXPECT_FALSE(exists(d + "/f"));
  EXPECT_FALSE(listDir(d).count("f"));
}

TEST(Unlink, MissingIsENOENT) {
  auto d = testDir();
  EXPECT_ERRNO(::unlink((d + "/f").c_str()), ENOENT);
}

TEST(Unlink, ThroughFileIsENOTDIR) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  EXPECT_ERRNO(::unlink((d + "/f/g").c_str()), ENOTDIR);
}

TEST(Unlink, WhileOpenForReadingStaysReadable) {
  auto d = testDir();
  std::string data = pattern(3 << 20, 11);
  ASSERT_TRUE(writeFile(d + "/f", data));
  int fd = ::open((d + "/f").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::unlink((d + "/f").c_str()), 0);
  EXPECT_FALSE(exists(d + "/f"));
  std::string got(data.size(), '\0');
  // The GC runs meanwhile; the chunks must survive until close.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  EXPECT_EQ(::pread(fd, got.data(), got.size(), 0), static_cast<ssize_t>(got.size()));
  EXPECT_TRUE(got == data);
  struct stat st;
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_EQ(st.st_nlink, 0u);
  ::close(fd);
}

TEST(Unlink, WhileOpenForWritingStaysWritable) {
  auto d = testDir();
  int fd = ::open((d + "/f").c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_EQ(::write(fd, "abc", 3), 3);
  ASSERT_EQ(::unlink((d + "/f").c_str()), 0);
  ASSERT_EQ(::pwrite(fd, "XYZ", 3, 1 << 20), 3);
  EXPECT_OK(::fsync(fd));
  char buf[3];
  EXPECT_EQ(::pread(fd, buf, 3, 1 << 20), 3);
  EXPECT_EQ(std::string(buf, 3), "XYZ");
  EXPECT_EQ(::pread(fd, buf, 3, 0), 3);
  EXPECT_EQ(std::string(buf, 3), "abc");
  ::close(fd);
  EXPECT_FALSE(exists(d + "/f"));
}

TEST(Unlink, RecreateWhileOldIsOpenGivesANewFile) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "old"));
  int fd = ::open((d + "/f").c_str(), O_RDONLY);
  ASSERT_EQ(::unlink((d + "/f").c_str()), 0);
  ASSERT_TRUE(writeFile(d + "/f", "new!"));
  char buf[8] = {};
  EXPECT_EQ(::pread(fd, buf, 8, 0), 3);
  EXPECT_EQ(std::string(buf), "old");
  ::close(fd);
  EXPECT_EQ(readFile(d + "/f"), "new!");
}

// --- rename -----------------------------------------------------------------------

TEST(Rename, Plain) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/a", "A"));
  EXPECT_OK(::rename((d + "/a").c_str(), (d + "/b").c_str()));
  EXPECT_FALSE(exists(d + "/a"));
  EXPECT_EQ(readFile(d + "/b"), "A");
}

TEST(Rename, AcrossDirectories) {
  auto d = testDir();
  ASSERT_EQ(::mkdir((d + "/x").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((d + "/y").c_str(), 0755), 0);
  ASSERT_TRUE(writeFile(d + "/x/f", "F"));
  EXPECT_OK(::rename((d + "/x/f").c_str(), (d + "/y/g").c_str()));
  EXPECT_EQ(readFile(d + "/y/g"), "F");
  EXPECT_FALSE(exists(d + "/x/f"));
}

TEST(Rename, OverExistingFileReplacesIt) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/a", "A"));
  ASSERT_TRUE(writeFile(d + "/b", "BBBB"));
  EXPECT_OK(::rename((d + "/a").c_str(), (d + "/b").c_str()));
  EXPECT_EQ(readFile(d + "/b"), "A");
  EXPECT_EQ(listDir(d).size(), 3u);
}

TEST(Rename, OverEmptyDirectory) {
  auto d = testDir();
  ASSERT_EQ(::mkdir((d + "/a").c_str(), 0755), 0);
  ASSERT_TRUE(writeFile(d + "/a/f", "x"));
  ASSERT_EQ(::mkdir((d + "/b").c_str(), 0755), 0);
  EXPECT_OK(::rename((d + "/a").c_str(), (d + "/b").c_str()));
  EXPECT_EQ(readFile(d + "/b/f"), "x");
}

TEST(Rename, OntoNonEmptyDirectoryIsENOTEMPTY) {
  auto d = testDir();
  ASSERT_EQ(::mkdir((d + "/a").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((d + "/b").c_str(), 0755), 0);
  ASSERT_TRUE(writeFile(d + "/b/f", "x"));
  EXPECT_ERRNO(::rename((d + "/a").c_str(), (d + "/b").c_str()), ENOTEMPTY);
  EXPECT_TRUE(exists(d + "/a"));
}

TEST(Rename, DirectoryOverFileIsENOTDIR) {
  auto d = testDir();
  ASSERT_EQ(::mkdir((d + "/a").c_str(), 0755), 0);
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  EXPECT_ERRNO(::rename((d + "/a").c_str(), (d + "/f").c_str()), ENOTDIR);
}

TEST(Rename, FileOverDirectoryIsEISDIR) {
  auto d = testDir();
  ASSERT_EQ(::mkdir((d + "/a").c_str(), 0755), 0);
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  EXPECT_ERRNO(::rename((d + "/f").c_str(), (d + "/a").c_str()), EISDIR);
}

TEST(Rename, IntoOwnSubtreeIsEINVAL) {
  auto d = testDir();
  ASSERT_EQ(::mkdir((d + "/a").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((d + "/a/b").c_str(), 0755), 0);
  EXPECT_ERRNO(::rename((d + "/a").c_str(), (d + "/a/b/c").c_str()), EINVAL);
  EXPECT_TRUE(exists(d + "/a/b"));
}

TEST(Rename, MissingSourceIsENOENT) {
  auto d = testDir();
  EXPECT_ERRNO(::rename((d + "/none").c_str(), (d + "/b").c_str()), ENOENT);
}

TEST(Rename, ToMissingDirectoryIsENOENT) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/a", "A"));
  EXPECT_ERRNO(::rename((d + "/a").c_str(), (d + "/no/b").c_str()), ENOENT);
  EXPECT_TRUE(exists(d + "/a"));
}

TEST(Rename, OntoItselfIsANoOp) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/a", "A"));
  EXPECT_OK(::rename((d + "/a").c_str(), (d + "/a").c_str()));
  EXPECT_EQ(readFile(d + "/a"), "A");
}

TEST(Rename, HardLinksOfOneInodeIsANoOp) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/a", "A"));
  ASSERT_EQ(::link((d + "/a").c_str(), (d + "/b").c_str()), 0);
  EXPECT_OK(::rename((d + "/a").c_str(), (d + "/b").c_str()));
  EXPECT_TRUE(exists(d + "/a"));
  EXPECT_TRUE(exists(d + "/b"));
}

TEST(Rename, NoReplaceOnExistingIsEEXIST) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/a", "A"));
  ASSERT_TRUE(writeFile(d + "/b", "B"));
  EXPECT_ERRNO(
      ::renameat2(AT_FDCWD, (d + "/a").c_str(), AT_FDCWD, (d + "/b").c_str(), RENAME_NOREPLACE),
      EEXIST);
  EXPECT_EQ(readFile(d + "/b"), "B");
}

TEST(Rename, NoReplaceOnFreeName) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/a", "A"));
  EXPECT_OK(
      ::renameat2(AT_FDCWD, (d + "/a").c_str(), AT_FDCWD, (d + "/c").c_str(), RENAME_NOREPLACE));
  EXPECT_EQ(readFile(d + "/c"), "A");
}

TEST(Rename, ExchangeSwaps) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/a", "A"));
  ASSERT_EQ(::mkdir((d + "/b").c_str(), 0755), 0);
  EXPECT_OK(
      ::renameat2(AT_FDCWD, (d + "/a").c_str(), AT_FDCWD, (d + "/b").c_str(), RENAME_EXCHANGE));
  EXPECT_TRUE(S_ISDIR(statOf(d + "/a").st_mode));
  EXPECT_EQ(readFile(d + "/b"), "A");
}

TEST(Rename, ExchangeWithMissingIsENOENT) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/a", "A"));
  EXPECT_ERRNO(
      ::renameat2(AT_FDCWD, (d + "/a").c_str(), AT_FDCWD, (d + "/b").c_str(), RENAME_EXCHANGE),
      ENOENT);
}

TEST(Rename, WhiteoutIsRejected) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/a", "A"));
  errno = 0;
  EXPECT_EQ(
      ::renameat2(AT_FDCWD, (d + "/a").c_str(), AT_FDCWD, (d + "/b").c_str(), RENAME_WHITEOUT), -1);
  EXPECT_TRUE(errno == EINVAL || errno == EPERM) << std::strerror(errno);
  EXPECT_TRUE(exists(d + "/a"));
}

TEST(Rename, OverAnOpenFileKeepsItReadable) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/old", "old contents"));
  ASSERT_TRUE(writeFile(d + "/new", "new"));
  int fd = ::open((d + "/old").c_str(), O_RDONLY);
  ASSERT_EQ(::rename((d + "/new").c_str(), (d + "/old").c_str()), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  char buf[32] = {};
  EXPECT_EQ(::pread(fd, buf, sizeof buf, 0), 12);
  EXPECT_EQ(std::string(buf), "old contents");
  ::close(fd);
  EXPECT_EQ(readFile(d + "/old"), "new");
}

TEST(Rename, DirectoryKeepsItsContents) {
  auto d = testDir();
  ASSERT_EQ(::mkdir((d + "/a").c_str(), 0755), 0);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(writeFile(d + "/a/" + std::to_string(i), "v"));
  ASSERT_EQ(::rename((d + "/a").c_str(), (d + "/z").c_str()), 0);
  EXPECT_EQ(listDir(d + "/z").size(), 12u);
  EXPECT_EQ(statOf(d + "/z/..").st_ino, statOf(d).st_ino);
}

// --- links --------------------------------------------------------------------------

TEST(Links, HardLinksShareData) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/a", "shared"));
  ASSERT_EQ(::link((d + "/a").c_str(), (d + "/b").c_str()), 0);
  EXPECT_EQ(statOf(d + "/a").st_nlink, 2u);
  EXPECT_EQ(statOf(d + "/a").st_ino, statOf(d + "/b").st_ino);
  int fd = ::open((d + "/b").c_str(), O_WRONLY | O_APPEND);
  ASSERT_EQ(::write(fd, "!", 1), 1);
  ::close(fd);
  EXPECT_EQ(readFile(d + "/a"), "shared!");
}

TEST(Links, UnlinkOneKeepsTheOther) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/a", "x"));
  ASSERT_EQ(::link((d + "/a").c_str(), (d + "/b").c_str()), 0);
  ASSERT_EQ(::unlink((d + "/a").c_str()), 0);
  EXPECT_EQ(readFile(d + "/b"), "x");
  EXPECT_EQ(statOf(d + "/b").st_nlink, 1u);
}

TEST(Links, LinkToExistingNameIsEEXIST) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/a", "x"));
  ASSERT_TRUE(writeFile(d + "/b", "y"));
  EXPECT_ERRNO(::link((d + "/a").c_str(), (d + "/b").c_str()), EEXIST);
}

TEST(Links, LinkOfDirectoryIsEPERM) {
  auto d = testDir();
  ASSERT_EQ(::mkdir((d + "/sub").c_str(), 0755), 0);
  EXPECT_ERRNO(::link((d + "/sub").c_str(), (d + "/l").c_str()), EPERM);
}

TEST(Links, LinkOfMissingIsENOENT) {
  auto d = testDir();
  EXPECT_ERRNO(::link((d + "/none").c_str(), (d + "/l").c_str()), ENOENT);
}

TEST(Links, LinkAcrossDirectories) {
  auto d = testDir();
  ASSERT_EQ(::mkdir((d + "/sub").c_str(), 0755), 0);
  ASSERT_TRUE(writeFile(d + "/a", "x"));
  EXPECT_OK(::link((d + "/a").c_str(), (d + "/sub/a2").c_str()));
  EXPECT_EQ(readFile(d + "/sub/a2"), "x");
}

TEST(Symlinks, CreateAndReadlink) {
  auto d = testDir();
  EXPECT_OK(::symlink("target/path", (d + "/l").c_str()));
  char buf[64] = {};
  EXPECT_EQ(::readlink((d + "/l").c_str(), buf, sizeof buf), 11);
  EXPECT_EQ(std::string(buf), "target/path");
  auto st = statOf(d + "/l");
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_EQ(st.st_size, 11);
}

TEST(Symlinks, FollowedOnOpen) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "via link"));
  ASSERT_EQ(::symlink("f", (d + "/l").c_str()), 0);
  EXPECT_EQ(readFile(d + "/l"), "via link");
  ASSERT_EQ(::mkdir((d + "/sub").c_str(), 0755), 0);
  ASSERT_EQ(::symlink("../f", (d + "/sub/up").c_str()), 0);
  EXPECT_EQ(readFile(d + "/sub/up"), "via link");
}

TEST(Symlinks, DanglingIsENOENTOnOpen) {
  auto d = testDir();
  ASSERT_EQ(::symlink("nowhere", (d + "/l").c_str()), 0);
  EXPECT_ERRNO(::open((d + "/l").c_str(), O_RDONLY), ENOENT);
  EXPECT_TRUE(exists(d + "/l"));
}

TEST(Symlinks, NoFollowIsELOOP) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  ASSERT_EQ(::symlink("f", (d + "/l").c_str()), 0);
  EXPECT_ERRNO(::open((d + "/l").c_str(), O_RDONLY | O_NOFOLLOW), ELOOP);
}

TEST(Symlinks, LoopIsELOOP) {
  auto d = testDir();
  ASSERT_EQ(::symlink("b", (d + "/a").c_str()), 0);
  ASSERT_EQ(::symlink("a", (d + "/b").c_str()), 0);
  EXPECT_ERRNO(::open((d + "/a").c_str(), O_RDONLY), ELOOP);
}

TEST(Symlinks, ReadlinkOfFileIsEINVAL) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  char buf[8];
  EXPECT_ERRNO(::readlink((d + "/f").c_str(), buf, sizeof buf), EINVAL);
}

TEST(Symlinks, OverExistingNameIsEEXIST) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  EXPECT_ERRNO(::symlink("t", (d + "/f").c_str()), EEXIST);
}

TEST(Symlinks, LongTarget) {
  auto d = testDir();
  std::string target(4000, 't');
  EXPECT_OK(::symlink(target.c_str(), (d + "/l").c_str()));
  std::vector<char> buf(5000);
  EXPECT_EQ(::readlink((d + "/l").c_str(), buf.data(), buf.size()), 4000);
}

// --- xattrs -------------------------------------------------------------------------

TEST(Xattr, SetGetListRemove) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  std::string p = d + "/f";
  EXPECT_OK(::setxattr(p.c_str(), "user.a", "1", 1, 0));
  EXPECT_OK(::setxattr(p.c_str(), "user.bb", "22", 2, 0));
  char buf[64] = {};
  EXPECT_EQ(::getxattr(p.c_str(), "user.bb", buf, sizeof buf), 2);
  EXPECT_EQ(std::string(buf, 2), "22");
  ssize_t n = ::listxattr(p.c_str(), buf, sizeof buf);
  std::set<std::string> names;
  for (ssize_t i = 0; i < n; i += static_cast<ssize_t>(std::strlen(buf + i)) + 1)
    names.insert(buf + i);
  EXPECT_EQ(names, (std::set<std::string>{"user.a", "user.bb"}));
  EXPECT_OK(::removexattr(p.c_str(), "user.a"));
  EXPECT_ERRNO(::getxattr(p.c_str(), "user.a", buf, sizeof buf), ENODATA);
}

// Declared here, defined with the metrics tests below.
double sample(const std::string& text, const std::string& series);

// The kernel asks for security.capability before the first write of every
// file; a file this mount just created has no xattrs, so that is answered
// without meta until the mount sets one.
TEST(Xattr, AFileCreatedHereIsAnsweredWithoutMetaUntilOneIsSet) {
  auto d = testDir();
  std::string p = d + "/f";
  int port = MountEnv::get().cluster().metricsPort();
  const std::string gets = R"(rpc_server_calls_total{method="cistern.meta.MetaService.GetXattr"})";
  const std::string lists =
      R"(rpc_server_calls_total{method="cistern.meta.MetaService.ListXattr"})";
  auto calls = [&](const std::string& series) {
    return std::max(0.0, sample(httpGet(port, "/metrics"), series));
  };
  double gets0 = calls(gets), lists0 = calls(lists);
  ASSERT_TRUE(writeFile(p, "x"));
  char buf[64] = {};
  EXPECT_ERRNO(::getxattr(p.c_str(), "user.a", buf, sizeof buf), ENODATA);
  EXPECT_ERRNO(::getxattr(p.c_str(), "security.capability", nullptr, 0), ENODATA);
  EXPECT_EQ(::listxattr(p.c_str(), buf, sizeof buf), 0);
  EXPECT_EQ(::listxattr(p.c_str(), nullptr, 0), 0);
  EXPECT_EQ(calls(gets), gets0);
  EXPECT_EQ(calls(lists), lists0);
  ASSERT_EQ(::setxattr(p.c_str(), "user.a", "1", 1, 0), 0) << std::strerror(errno);
  EXPECT_EQ(::getxattr(p.c_str(), "user.a", buf, sizeof buf), 1);
  EXPECT_EQ(buf[0], '1');
  EXPECT_EQ(::listxattr(p.c_str(), buf, sizeof buf), 7);
  EXPECT_EQ(std::string(buf, 7), std::string("user.a\0", 7));
  EXPECT_EQ(calls(gets), gets0 + 1);
  EXPECT_EQ(calls(lists), lists0 + 1);
}

// Gives the file open as fd a capability (CAP_NET_RAW) as setcap(8) would.
int setCapability(int fd) {
  vfs_cap_data cap{};
  cap.magic_etc = VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE;
  cap.data[0].permitted = 1u << CAP_NET_RAW;
  return ::fsetxattr(fd, "security.capability", &cap, XATTR_CAPS_SZ_2, 0);
}

// The kernel asks for security.capability before every write through its
// page cache (a descriptor that can read). For
// a file open on this mount meta's answer holds for attr_timeout (1 s here;
// another client's change shows after it); a capability set through the
// mount meanwhile is still seen, and dropped, by the next write.
TEST(Xattr, WritesAskMetaForCapabilitiesOncePerAttrTimeoutAndStillDropThem) {
  auto d = testDir();
  std::string p = d + "/f";
  int port = MountEnv::get().cluster().metricsPort();
  const std::string gets = R"(rpc_server_calls_total{method="cistern.meta.MetaService.GetXattr"})";
  auto calls = [&] { return std::max(0.0, sample(httpGet(port, "/metrics"), gets)); };
  ASSERT_TRUE(writeFile(p, "x"));
  // Setting an xattr ends "just created, none" for the file.
  ASSERT_EQ(::setxattr(p.c_str(), "user.a", "1", 1, 0), 0) << std::strerror(errno);
  ASSERT_EQ(::removexattr(p.c_str(), "user.a"), 0) << std::strerror(errno);
  double gets0 = calls();
  int fd = ::open(p.c_str(), O_RDWR | O_APPEND);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  for (int i = 0; i < 50; ++i) ASSERT_EQ(::write(fd, "y", 1), 1) << std::strerror(errno);
  EXPECT_EQ(calls(), gets0 + 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  ASSERT_EQ(::write(fd, "y", 1), 1) << std::strerror(errno);
  EXPECT_EQ(calls(), gets0 + 2);  // asked again once the answer was a second old

  ASSERT_EQ(setCapability(fd), 0) << std::strerror(errno);
  EXPECT_EQ(::getxattr(p.c_str(), "security.capability", nullptr, 0),
            static_cast<ssize_t>(XATTR_CAPS_SZ_2));
  ASSERT_EQ(::write(fd, "z", 1), 1) << std::strerror(errno);
  EXPECT_ERRNO(::getxattr(p.c_str(), "security.capability", nullptr, 0), ENODATA);
  ASSERT_EQ(::close(fd), 0);
  EXPECT_EQ(readFile(p), "x" + std::string(51, 'y') + "z");
}

// The same through write-only descriptors, whose writes the kernel sends
// past its page cache without asking (ops_file.cc, attach): the mount drops
// the capability itself, on a file it just created and on one opened again.
// Setting it ended "just created, none", so the check costs one GetXattr per
// attr_timeout, as above.
TEST(Xattr, WritesThroughWriteOnlyDescriptorsDropACapability) {
  auto d = testDir();
  std::string p = d + "/f";
  for (int flags : {O_WRONLY | O_CREAT | O_EXCL, O_WRONLY | O_APPEND}) {
    int fd = ::open(p.c_str(), flags, 0755);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    ASSERT_EQ(::write(fd, "a", 1), 1) << std::strerror(errno);
    ASSERT_EQ(setCapability(fd), 0) << std::strerror(errno);
    EXPECT_EQ(::getxattr(p.c_str(), "security.capability", nullptr, 0),
              static_cast<ssize_t>(XATTR_CAPS_SZ_2));
    ASSERT_EQ(::write(fd, "b", 1), 1) << std::strerror(errno);
    EXPECT_ERRNO(::getxattr(p.c_str(), "security.capability", nullptr, 0), ENODATA);
    ASSERT_EQ(setCapability(fd), 0) << std::strerror(errno);
    ASSERT_EQ(::write(fd, "c", 1), 1) << std::strerror(errno);
    EXPECT_ERRNO(::getxattr(p.c_str(), "security.capability", nullptr, 0), ENODATA);
    ASSERT_EQ(::close(fd), 0);
  }
  EXPECT_EQ(readFile(p), "abcabc");
}

TEST(Xattr, SizeQueryWithZeroBuffer) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  std::string p = d + "/f";
  ASSERT_EQ(::setxattr(p.c_str(), "user.v", "12345", 5, 0), 0);
  EXPECT_EQ(::getxattr(p.c_str(), "user.v", nullptr, 0), 5);
  EXPECT_EQ(::listxattr(p.c_str(), nullptr, 0), 7);
}

TEST(Xattr, TooSmallBufferIsERANGE) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  std::string p = d + "/f";
  ASSERT_EQ(::setxattr(p.c_str(), "user.v", "12345", 5, 0), 0);
  char buf[2];
  EXPECT_ERRNO(::getxattr(p.c_str(), "user.v", buf, sizeof buf), ERANGE);
  EXPECT_ERRNO(::listxattr(p.c_str(), buf, sizeof buf), ERANGE);
}

TEST(Xattr, CreateFlagOnExistingIsEEXIST) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  std::string p = d + "/f";
  ASSERT_EQ(::setxattr(p.c_str(), "user.v", "1", 1, 0), 0);
  EXPECT_ERRNO(::setxattr(p.c_str(), "user.v", "2", 1, XATTR_CREATE), EEXIST);
}

TEST(Xattr, ReplaceFlagOnMissingIsENODATA) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  EXPECT_ERRNO(::setxattr((d + "/f").c_str(), "user.v", "2", 1, XATTR_REPLACE), ENODATA);
}

TEST(Xattr, ReplaceChangesValue) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  std::string p = d + "/f";
  ASSERT_EQ(::setxattr(p.c_str(), "user.v", "1", 1, 0), 0);
  EXPECT_OK(::setxattr(p.c_str(), "user.v", "abc", 3, XATTR_REPLACE));
  char buf[8] = {};
  EXPECT_EQ(::getxattr(p.c_str(), "user.v", buf, sizeof buf), 3);
  EXPECT_EQ(std::string(buf, 3), "abc");
}

TEST(Xattr, RemoveMissingIsENODATA) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  EXPECT_ERRNO(::removexattr((d + "/f").c_str(), "user.none"), ENODATA);
}

TEST(Xattr, UnknownNamespaceIsRejected) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  errno = 0;
  EXPECT_EQ(::setxattr((d + "/f").c_str(), "bogus.v", "1", 1, 0), -1);
  EXPECT_TRUE(errno == ENOTSUP || errno == EOPNOTSUPP || errno == EINVAL) << std::strerror(errno);
}

TEST(Xattr, OnDirectories) {
  auto d = testDir();
  EXPECT_OK(::setxattr(d.c_str(), "user.dir", "yes", 3, 0));
  char buf[8] = {};
  EXPECT_EQ(::getxattr(d.c_str(), "user.dir", buf, sizeof buf), 3);
}

TEST(Xattr, BinaryValue) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x"));
  std::string v("a\0b\xff", 4);
  EXPECT_OK(::setxattr((d + "/f").c_str(), "user.bin", v.data(), v.size(), 0));
  char buf[8];
  EXPECT_EQ(::getxattr((d + "/f").c_str(), "user.bin", buf, sizeof buf), 4);
  EXPECT_EQ(std::string(buf, 4), v);
}

// --- statfs and access ------------------------------------------------------------------

TEST(Statfs, ReportsSpaceAndNameMax) {
  auto d = testDir();
  struct statvfs st;
  ASSERT_EQ(::statvfs(d.c_str(), &st), 0);
  EXPECT_GT(st.f_blocks, 0u);
  EXPECT_LE(st.f_bfree, st.f_blocks);
  EXPECT_EQ(st.f_namemax, 255u);
  EXPECT_GT(st.f_ffree, 0u);
}

TEST(Statfs, InodesUsedGrow) {
  auto d = testDir();
  struct statvfs a, b;
  ASSERT_EQ(::statvfs(d.c_str(), &a), 0);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(writeFile(d + "/f" + std::to_string(i), ""));
  ASSERT_EQ(::statvfs(d.c_str(), &b), 0);
  EXPECT_EQ((b.f_files - b.f_ffree) - (a.f_files - a.f_ffree), 5u);
}

TEST(Access, ExistingAndMissing) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x", 0644));
  EXPECT_OK(::access((d + "/f").c_str(), F_OK));
  EXPECT_OK(::access((d + "/f").c_str(), R_OK | W_OK));
  EXPECT_ERRNO(::access((d + "/none").c_str(), F_OK), ENOENT);
}

TEST(Access, RootNeedsAnExecBitForX) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "x", 0644));
  EXPECT_ERRNO(::access((d + "/f").c_str(), X_OK), EACCES);
  ASSERT_EQ(::chmod((d + "/f").c_str(), 0744), 0);
  EXPECT_OK(::access((d + "/f").c_str(), X_OK));
}

// --- mmap -------------------------------------------------------------------------------

TEST(Mmap, ReadsTheFile) {
  auto d = testDir();
  std::string data = pattern((2 << 20) + 333, 21);
  ASSERT_TRUE(writeFile(d + "/f", data));
  int fd = ::open((d + "/f").c_str(), O_RDONLY);
  void* p = ::mmap(nullptr, data.size(), PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(std::memcmp(p, data.data(), data.size()), 0);
  ::munmap(p, data.size());
  ::close(fd);
}

TEST(Mmap, PrivateMapOfAHole) {
  auto d = testDir();
  int fd = ::open((d + "/f").c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_EQ(::pwrite(fd, "z", 1, 100000), 1);
  char* p = static_cast<char*>(::mmap(nullptr, 100001, PROT_READ, MAP_PRIVATE, fd, 0));
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(p[0], 0);
  EXPECT_EQ(p[100000], 'z');
  ::munmap(p, 100001);
  ::close(fd);
}

TEST(Mmap, SharedWritesReachTheFile) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", std::string(8192, 'a')));
  int fd = ::open((d + "/f").c_str(), O_RDWR);
  char* p = static_cast<char*>(::mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(p, MAP_FAILED);
  std::memcpy(p + 4000, "MMAP", 4);
  EXPECT_EQ(::msync(p, 8192, MS_SYNC), 0);
  ::munmap(p, 8192);
  ::close(fd);
  std::string got = readFile(d + "/f");
  EXPECT_EQ(got.substr(4000, 4), "MMAP");
  EXPECT_EQ(got.size(), 8192u);
}

TEST(Mmap, SeesWritesMadeThroughADescriptor) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", std::string(4096, 'a')));
  int fd = ::open((d + "/f").c_str(), O_RDWR);
  char* p = static_cast<char*>(::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0));
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(p[10], 'a');
  ASSERT_EQ(::pwrite(fd, "b", 1, 10), 1);
  EXPECT_EQ(p[10], 'b');
  ::munmap(p, 4096);
  ::close(fd);
}

// --- another client (the CLI) next to the mount: close-to-open -------------------

std::string remoteOf(const std::string& local) {
  return local.substr(MountEnv::get().mnt().size());
}

CliResult cli(const std::vector<std::string>& args) {
  std::vector<std::string> all = args;
  all.insert(all.begin() + 1, {"--cluster", MountEnv::get().cluster().cluster()});
  return runProgram(CISTERN_BIN, all);
}

TEST(CloseToOpen, ReopenSeesAnotherClientsNewContents) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/f", "old-contents"));
  EXPECT_EQ(readFile(d + "/f"), "old-contents");  // now in the page cache
  char tmpl[] = "/tmp/cistern-c2o-XXXXXX";
  int fd = mkstemp(tmpl);
  std::string longer = "new contents, and longer than before";
  ASSERT_EQ(::write(fd, longer.data(), longer.size()), static_cast<ssize_t>(longer.size()));
  ::close(fd);
  auto put = cli({"put", tmpl, remoteOf(d + "/f")});
  ASSERT_EQ(put.exit_code, 0) << put.err;
  EXPECT_EQ(readFile(d + "/f"), longer);
  ::unlink(tmpl);
}

TEST(CloseToOpen, AnotherClientSeesWritesAfterClose) {
  auto d = testDir();
  int fd = ::open((d + "/f").c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_EQ(::write(fd, "written on the mount", 20), 20);
  ASSERT_EQ(::close(fd), 0);
  auto cat = cli({"cat", remoteOf(d + "/f")});
  EXPECT_EQ(cat.exit_code, 0) << cat.err;
  EXPECT_EQ(cat.out, "written on the mount");
}

TEST(CloseToOpen, AnotherClientsCreateAndUnlinkShowUp) {
  auto d = testDir();
  EXPECT_FALSE(exists(d + "/later"));  // a negative entry, cached for a second at most
  ASSERT_EQ(cli({"mkdir", remoteOf(d + "/later")}).exit_code, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_TRUE(exists(d + "/later"));
  ASSERT_EQ(cli({"rm", "-r", remoteOf(d + "/later")}).exit_code, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_FALSE(exists(d + "/later"));
}

double sample(const std::string& text, const std::string& series);

// A listing read to its end is kept by the kernel (FOPEN_CACHE_DIR) for
// entry_timeout (1 s here): listing again sends no readdir; a change through
// the mount shows at once (the kernel drops the cache); another client's
// shows once the second is over.
TEST(CloseToOpen, ListingsAreCachedForAnEntryTimeout) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/a", "1"));
  const std::set<std::string> start{".", "..", "a"};
  EXPECT_EQ(listDir(d), start);
  int port = MountEnv::get().cluster().metricsPort();
  auto readdirs = [port] {
    std::string m = httpGet(port, "/metrics");
    return std::max(0.0, sample(m, R"(fuse_requests_total{op="readdir"})")) +
           std::max(0.0, sample(m, R"(fuse_requests_total{op="readdirplus"})"));
  };
  double before = readdirs();
  EXPECT_GT(before, 0);
  EXPECT_EQ(listDir(d), start);
  EXPECT_EQ(readdirs(), before) << "the second listing was not served from the kernel's cache";
  ASSERT_TRUE(writeFile(d + "/b", "2"));
  EXPECT_EQ(listDir(d), (std::set<std::string>{".", "..", "a", "b"}));
  ASSERT_EQ(cli({"mkdir", remoteOf(d + "/c")}).exit_code, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_EQ(listDir(d), (std::set<std::string>{".", "..", "a", "b", "c"}));
}

// --- metrics ----------------------------------------------------------------------------

// The value of one sample line ("name{labels} value") in Prometheus text; -1 if absent.
double sample(const std::string& text, const std::string& series) {
  size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

// A small file's bytes come with its open (kept inline in the KV): the
// mount puts them in the page cache with the open, so reading it sends no
// read request; an ioctl (isatty, which Python's open() asks) is ENOTTY
// at once.
TEST(Metrics, ASmallFileIsReadFromThePageCacheItsOpenFilled) {
  auto d = testDir();
  int port = MountEnv::get().cluster().metricsPort();
  const std::string reads = R"(fuse_requests_total{op="read"})";
  ASSERT_TRUE(writeFile(d + "/f", "small and inline"));
  struct stat st;
  ASSERT_EQ(::stat((d + "/f").c_str(), &st), 0);
  double before = std::max(0.0, sample(httpGet(port, "/metrics"), reads));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(readFile(d + "/f"), "small and inline");
  EXPECT_EQ(std::max(0.0, sample(httpGet(port, "/metrics"), reads)), before);
  int fd = ::open((d + "/f").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(::isatty(fd), 0);
  EXPECT_EQ(errno, ENOTTY);
  ::close(fd);
}

// A file of 100 KiB, in a chunk: open, read to the end, close is one read
// request from the kernel and at most one storage call (none when the
// mount reads the server's files on this host itself, with socket_calls).
TEST(Metrics, ASmallFileInAChunkIsOneStorageRead) {
  auto d = testDir();
  int port = MountEnv::get().cluster().metricsPort();
  const std::string storage_reads =
      R"(rpc_server_latency_us_count{method="cistern.storage.StorageService.BatchRead"})";
  const std::string kernel_reads = R"(fuse_requests_total{op="read"})";
  const std::string want(100 << 10, 'c');
  ASSERT_TRUE(writeFile(d + "/f", want));  // write-only: nothing of it in the page cache
  auto count = [&](const std::string& m, const std::string& series) {
    return std::max(0.0, sample(m, series));
  };
  std::string before = httpGet(port, "/metrics");
  EXPECT_EQ(readFile(d + "/f"), want);
  std::string after = httpGet(port, "/metrics");
  EXPECT_EQ(count(after, kernel_reads), count(before, kernel_reads) + 1);
  EXPECT_LE(count(after, storage_reads), count(before, storage_reads) + 1);
}

// A read-only close has nothing to flush: the kernel is told not to send
// FLUSH for it; a close after writing still sends one (its errors reach
// close(2)).
TEST(Metrics, ReadOnlyClosesSendNoFlush) {
  auto d = testDir();
  int port = MountEnv::get().cluster().metricsPort();
  const std::string flushes = R"(fuse_requests_total{op="flush"})";
  ASSERT_TRUE(writeFile(d + "/f", "hello"));
  std::string before = httpGet(port, "/metrics");
  for (int i = 0; i < 3; ++i) {
    int fd = ::open((d + "/f").c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    char buf[16];
    EXPECT_EQ(::read(fd, buf, sizeof buf), 5);
    EXPECT_EQ(::close(fd), 0);
  }
  std::string after = httpGet(port, "/metrics");
  EXPECT_EQ(sample(after, flushes), sample(before, flushes)) << after;
  int fd = ::open((d + "/f").c_str(), O_WRONLY | O_APPEND);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "!", 1), 1);
  EXPECT_EQ(::close(fd), 0);
  std::string last = httpGet(port, "/metrics");
  EXPECT_EQ(sample(last, flushes) - sample(after, flushes), 1) << last;
  EXPECT_EQ(readFile(d + "/f"), "hello!");
}

// A write-only descriptor is written past the kernel's page cache
// (FOPEN_DIRECT_IO), so its writes come without the kernel's getxattr of
// security.capability that precedes every write(2) through the cache; the
// bytes are the same either way.
TEST(Metrics, WriteOnlyDescriptorsNeedNoCapabilityLookup) {
  auto d = testDir();
  int port = MountEnv::get().cluster().metricsPort();
  const std::string getxattrs = R"(fuse_requests_total{op="getxattr"})";
  auto count = [&] { return std::max(0.0, sample(httpGet(port, "/metrics"), getxattrs)); };
  std::string data = pattern(3 * 4096 + 5, 3);
  // Getxattr requests while DIR/new, opened with `flags`, is written 4 KiB at a time.
  auto lookups = [&](int flags) {
    double before = count();
    int fd = ::open((d + "/new").c_str(), flags, 0644);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    for (size_t at = 0; at < data.size(); at += 4096) {
      size_t n = std::min<size_t>(4096, data.size() - at);
      EXPECT_EQ(::write(fd, data.data() + at, n), static_cast<ssize_t>(n)) << std::strerror(errno);
    }
    EXPECT_EQ(::close(fd), 0);
    EXPECT_EQ(readFile(d + "/new"), data);
    return count() - before;
  };
  EXPECT_EQ(lookups(O_WRONLY | O_CREAT | O_TRUNC), 0);  // created
  EXPECT_EQ(lookups(O_WRONLY), 0);                      // opened again
  EXPECT_GE(lookups(O_RDWR), 1);                        // through the page cache
}

// O_DIRECT reads land in the reply's buffer with no copy out of a slot,
// byte-exact. The mount of `cistern up --mount` reads them as local calls,
// unless it runs with -o socket_calls; then, as root on the servers' host,
// it reads them from the servers' files itself (short-circuit; without it,
// the servers would write them into its shared-memory windows).
TEST(Metrics, DirectReadsLandInTheReplyBufferWithoutACopy) {
  auto d = testDir();
  int port = MountEnv::get().cluster().metricsPort();
  const bool local = MountEnv::get().options().find("socket_calls") == std::string::npos;
  const std::string windowed = local ? R"(client_read_bytes_total{path="local"})"
                                     : R"(client_read_bytes_total{path="short_circuit"})";
  std::string data = pattern(3 << 20, 12);
  ASSERT_TRUE(writeFile(d + "/f", data));
  int fd = ::open((d + "/f").c_str(), O_RDONLY | O_DIRECT);
  ASSERT_GE(fd, 0);
  void* buf = nullptr;
  ASSERT_EQ(posix_memalign(&buf, 4096, 1 << 20), 0);
  std::string before = httpGet(port, "/metrics");
  for (int i = 2; i >= 0; --i) {
    ASSERT_EQ(::pread(fd, buf, 1 << 20, off_t{i} << 20), 1 << 20);
    EXPECT_EQ(std::memcmp(buf, data.data() + (size_t{static_cast<size_t>(i)} << 20), 1 << 20), 0);
  }
  std::string after = httpGet(port, "/metrics");
  free(buf);
  ::close(fd);
  // A counter that never moved is not exported yet.
  const double from = std::max(0.0, sample(before, windowed));
  EXPECT_EQ(static_cast<int64_t>(sample(after, windowed) - from), 3 << 20) << after;
}

TEST(Metrics, RequestsAndErrorsByOperation) {
  auto d = testDir();
  int port = MountEnv::get().cluster().metricsPort();
  const std::string errors = R"(fuse_errors_total{op="rmdir",errno="ENOTEMPTY"})";
  const std::string mkdirs = R"(fuse_requests_total{op="mkdir"})";
  std::string before = httpGet(port, "/metrics");
  ASSERT_EQ(::mkdir((d + "/sub").c_str(), 0755), 0);
  ASSERT_TRUE(writeFile(d + "/sub/f", "x"));
  EXPECT_ERRNO(::rmdir((d + "/sub").c_str()), ENOTEMPTY);
  std::string after = httpGet(port, "/metrics");
  EXPECT_EQ(sample(after, mkdirs) - std::max(0.0, sample(before, mkdirs)), 1) << after;
  EXPECT_EQ(sample(after, errors) - std::max(0.0, sample(before, errors)), 1);
  EXPECT_NE(after.find(R"(fuse_request_latency_us_count{op="create"})"), std::string::npos);
}

// The kernel re-reads a directory's attributes after every name added or
// removed in it; names do not change a directory's inode, so the mount
// answers those itself, and still shows this mount's own changes of the
// directory at once.
TEST(DirAttrs, ReReadsAfterNamesChangeAreAnsweredByTheMountOwnChangesShowAtOnce) {
  auto d = testDir();
  std::string sub = d + "/sub";
  ASSERT_EQ(::mkdir(sub.c_str(), 0755), 0);
  int port = MountEnv::get().cluster().metricsPort();
  const std::string getattrs =
      R"(rpc_server_calls_total{method="cistern.meta.MetaService.Getattr"})";
  auto calls = [&] { return std::max(0.0, sample(httpGet(port, "/metrics"), getattrs)); };
  struct stat st;
  ASSERT_EQ(::stat(sub.c_str(), &st), 0);
  double before = calls();
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(writeFile(sub + "/f" + std::to_string(i), "x"));
    ASSERT_EQ(::stat(sub.c_str(), &st), 0);
  }
  for (int i = 0; i < 10; ++i) ASSERT_EQ(::unlink((sub + "/f" + std::to_string(i)).c_str()), 0);
  EXPECT_LE(calls() - before, 2);  // 30 name changes: the kernel asked ~30 times
  // Each change below is followed by a new name, so that the kernel drops
  // the attributes the change's reply gave it and asks the mount again.
  int names = 0;
  auto statAfterANewName = [&] {
    EXPECT_TRUE(writeFile(sub + "/n" + std::to_string(names++), "x"));
    EXPECT_EQ(::stat(sub.c_str(), &st), 0);
  };
  ASSERT_EQ(::chmod(sub.c_str(), 0700), 0);
  statAfterANewName();
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  timespec times[2] = {{1000, 0}, {2000, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, sub.c_str(), times, 0), 0);
  statAfterANewName();
  EXPECT_EQ(st.st_mtim.tv_sec, 2000);
  ASSERT_EQ(::chown(sub.c_str(), 1234, 5678), 0);
  statAfterANewName();
  EXPECT_EQ(st.st_uid, 1234u);
  EXPECT_EQ(st.st_gid, 5678u);
  struct stat before_xattr = st;
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_EQ(::setxattr(sub.c_str(), "user.a", "1", 1, 0), 0);
  statAfterANewName();
  EXPECT_GT(st.st_ctim.tv_sec * 1000000000L + st.st_ctim.tv_nsec,
            before_xattr.st_ctim.tv_sec * 1000000000L + before_xattr.st_ctim.tv_nsec);
  ASSERT_EQ(::rename(sub.c_str(), (d + "/moved").c_str()), 0);
  ASSERT_EQ(::stat((d + "/moved").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 1234u);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
}

// --- concurrency ----------------------------------------------------------------------------

TEST(Concurrency, AppendersFromManyThreadsLoseNothing) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/log", ""));
  const int threads = 4, lines = 200;
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      int fd = ::open((d + "/log").c_str(), O_WRONLY | O_APPEND);
      for (int i = 0; i < lines; ++i) {
        char line[32];
        int n = snprintf(line, sizeof line, "t%d-%04d\n", t, i);
        ASSERT_EQ(::write(fd, line, static_cast<size_t>(n)), n);
      }
      ::close(fd);
    });
  }
  for (auto& t : ts) t.join();
  std::string all = readFile(d + "/log");
  std::set<std::string> seen;
  size_t pos = 0;
  while (pos < all.size()) {
    size_t nl = all.find('\n', pos);
    ASSERT_NE(nl, std::string::npos);
    seen.insert(all.substr(pos, nl - pos));
    pos = nl + 1;
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(threads * lines));
  EXPECT_EQ(all.size(), static_cast<size_t>(threads * lines * 8));
}

// Small new files keep their bytes in the metadata service (inline, up to 8
// KiB); every way of reading and changing them sees what a file in chunks
// would show, including after the page cache is dropped.
void dropCaches() {
  ::sync();
  int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY);
  if (fd >= 0) {
    (void)!::write(fd, "3", 1);
    ::close(fd);
  }
}

TEST(Inline, SmallFilesOfEverySizeReadBackCold) {
  auto d = testDir();
  const std::vector<size_t> sizes = {0, 1, 4095, 4096, 8191, 8192, 8193, 20000};
  for (size_t n : sizes)
    ASSERT_TRUE(writeFile(d + "/f" + std::to_string(n), pattern(n, static_cast<uint32_t>(n))));
  dropCaches();
  for (size_t n : sizes) {
    EXPECT_EQ(statOf(d + "/f" + std::to_string(n)).st_size, static_cast<off_t>(n));
    EXPECT_TRUE(readFile(d + "/f" + std::to_string(n)) == pattern(n, static_cast<uint32_t>(n)))
        << n;
  }
  // A hard link and a rename read the same bytes; an unlinked open file too.
  ASSERT_EQ(::link((d + "/f4095").c_str(), (d + "/link").c_str()), 0);
  ASSERT_EQ(::rename((d + "/f1").c_str(), (d + "/moved").c_str()), 0);
  dropCaches();
  EXPECT_TRUE(readFile(d + "/link") == pattern(4095, 4095));
  EXPECT_TRUE(readFile(d + "/moved") == pattern(1, 1));
  int fd = ::open((d + "/f8192").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::unlink((d + "/f8192").c_str()), 0);
  std::string back(8192, '\0');
  EXPECT_EQ(::pread(fd, back.data(), back.size(), 0), 8192);
  EXPECT_TRUE(back == pattern(8192, 8192));
  ::close(fd);
}

TEST(Inline, WritersTruncatesAndMmapSeeTheSameBytes) {
  auto d = testDir();
  std::string want = pattern(3000, 5);
  ASSERT_TRUE(writeFile(d + "/f", want));
  // Overwrite in the middle: the bytes move to a chunk first.
  int fd = ::open((d + "/f").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, "MIDDLE", 6, 1000), 6);
  ASSERT_EQ(::close(fd), 0);
  want.replace(1000, 6, "MIDDLE");
  dropCaches();
  EXPECT_TRUE(readFile(d + "/f") == want);
  // Truncates of an inline file: down, up within the limit, past it.
  ASSERT_TRUE(writeFile(d + "/t", pattern(5000, 6)));
  ASSERT_EQ(::truncate((d + "/t").c_str(), 100), 0);
  ASSERT_EQ(::truncate((d + "/t").c_str(), 7000), 0);
  std::string t = pattern(5000, 6).substr(0, 100) + std::string(6900, '\0');
  dropCaches();
  EXPECT_TRUE(readFile(d + "/t") == t);
  ASSERT_EQ(::truncate((d + "/t").c_str(), 100000), 0);
  t.resize(100000, '\0');
  dropCaches();
  EXPECT_TRUE(readFile(d + "/t") == t);
  // mmap of an inline file.
  ASSERT_TRUE(writeFile(d + "/m", pattern(6000, 7)));
  dropCaches();
  fd = ::open((d + "/m").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  void* p = ::mmap(nullptr, 6000, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_TRUE(std::string(static_cast<const char*>(p), 6000) == pattern(6000, 7));
  ::munmap(p, 6000);
  ::close(fd);
}

// The kernel flushes at every close of a descriptor of the file (a dup, a
// forked child's exit): the first such flush may put the bytes inline while
// the writer goes on; its next writes move them to a chunk and land after them.
TEST(Inline, WritesAfterAFlushOfAnotherDescriptorLandAfterTheInlineBytes) {
  auto d = testDir();
  int fd = ::open((d + "/f").c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "first-", 6), 6);
  int dup = ::dup(fd);
  ASSERT_EQ(::close(dup), 0);
  pid_t pid = fork();
  if (pid == 0) _exit(0);  // the child's exit closes its copy: another flush
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_EQ(::write(fd, "second", 6), 6);
  ASSERT_EQ(::close(fd), 0);
  dropCaches();
  EXPECT_EQ(readFile(d + "/f"), "first-second");
  // The same with a preallocation past the inline limit after the flush.
  fd = ::open((d + "/g").c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "abc", 3), 3);
  ASSERT_EQ(::close(::dup(fd)), 0);
  ASSERT_EQ(::fallocate(fd, 0, 0, 100000), 0) << std::strerror(errno);
  ASSERT_EQ(::pwrite(fd, "z", 1, 99999), 1);
  ASSERT_EQ(::close(fd), 0);
  std::string g = "abc" + std::string(99996, '\0') + "z";
  dropCaches();
  EXPECT_TRUE(readFile(d + "/g") == g);
}

TEST(Concurrency, AppendersFromManyProcessesLoseNothing) {
  auto d = testDir();
  ASSERT_TRUE(writeFile(d + "/log", ""));
  const int procs = 4, lines = 100;
  std::vector<pid_t> pids;
  for (int p = 0; p < procs; ++p) {
    pid_t pid = fork();
    if (pid == 0) {
      int fd = ::open((d + "/log").c_str(), O_WRONLY | O_APPEND);
      for (int i = 0; i < lines; ++i) {
        char line[32];
        int n = snprintf(line, sizeof line, "p%d-%04d\n", p, i);
        if (::write(fd, line, static_cast<size_t>(n)) != n) _exit(1);
      }
      _exit(::close(fd) == 0 ? 0 : 1);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_EQ(status, 0);
  }
  std::string all = readFile(d + "/log");
  EXPECT_EQ(all.size(), static_cast<size_t>(procs * lines * 8));
  for (int p = 0; p < procs; ++p)
    for (int i = 0; i < lines; ++i) {
      char line[32];
      snprintf(line, sizeof line, "p%d-%04d\n", p, i);
      EXPECT_NE(all.find(line), std::string::npos) << line;
    }
}

TEST(Concurrency, CreatorsInOneDirectory) {
  auto d = testDir();
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i)
        EXPECT_TRUE(writeFile(d + "/t" + std::to_string(t) + "_" + std::to_string(i), "x"));
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(listDir(d).size(), 402u);
}

TEST(Concurrency, ExclusiveCreateHasOneWinner) {
  auto d = testDir();
  std::atomic<int> winners{0}, eexist{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t)
    ts.emplace_back([&] {
      int fd = ::open((d + "/lock").c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
      if (fd >= 0) {
        ++winners;
        ::close(fd);
      } else if (errno == EEXIST) {
        ++eexist;
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(winners.load(), 1);
  EXPECT_EQ(eexist.load(), 7);
}

TEST(Concurrency, ParallelReadersOfOneFile) {
  auto d = testDir();
  std::string data = pattern(4 << 20, 31);
  ASSERT_TRUE(writeFile(d + "/f", data));
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      int fd = ::open((d + "/f").c_str(), O_RDONLY | O_DIRECT);
      void* buf = nullptr;
      ASSERT_EQ(posix_memalign(&buf, 4096, 1 << 20), 0);
      for (int i = 3; i >= 0; --i) {
        ASSERT_EQ(::pread(fd, buf, 1 << 20, off_t{i} << 20), 1 << 20);
        EXPECT_EQ(std::memcmp(buf, data.data() + (size_t{static_cast<size_t>(i)} << 20), 1 << 20),
                  0);
      }
      free(buf);
      ::close(fd);
    });
  for (auto& t : ts) t.join();
}

}  // namespace
}  // namespace cistern::testing

CISTERN_FUSE_TEST_MAIN()
