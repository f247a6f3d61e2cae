// The POSIX suite with ext4 as the oracle: every case runs the same calls in
// a directory on the mount and in a directory on the local ext4 file system,
// in the same run, and the two must answer alike (errno, and what a stat
// sees afterwards). Cases: each file type (regular, directory, symlink, FIFO,
// socket, character and block device) under each operation, as root, as the
// node's owner and as someone else; sticky directories; utimensat's rules;
// size limits; the order of ENOENT / ENOTDIR / EACCES along a path; and
// directory edge cases (renames, rmdir, links, trailing slashes).
// Known differences that FUSE or the design imposes are listed in
// docs/fuse.md ("Where the mount differs from ext4") and kept out of here.
#include <dirent.h>
#include <fmt/format.h>
#include <linux/magic.h>
#include <sys/socket.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/xattr.h>

#include <climits>
#include <vector>

#include "tests/fuse/mount_env.h"

namespace cistern::testing {
namespace {

enum class Kind { kReg, kDir, kLink, kFifo, kSock, kChr, kBlk };
constexpr Kind kAllKinds[] = {Kind::kReg,  Kind::kDir, Kind::kLink, Kind::kFifo,
                              Kind::kSock, Kind::kChr, Kind::kBlk};

const char* kindName(Kind k) {
  switch (k) {
    case Kind::kReg:
      return "Reg";
    case Kind::kDir:
      return "Dir";
    case Kind::kLink:
      return "Symlink";
    case Kind::kFifo:
      return "Fifo";
    case Kind::kSock:
      return "Socket";
    case Kind::kChr:
      return "CharDev";
    case Kind::kBlk:
      return "BlockDev";
  }
  return "?";
}

// Makes a node of kind `k` at `p` owned by uid:gid with `mode` (a symlink
// points at "target", a regular file in the same directory).
void makeNode(const std::string& p, Kind k, mode_t mode, uid_t uid, gid_t gid) {
  int rc = 0;
  switch (k) {
    case Kind::kReg:
      rc = writeFile(p, "data") ? 0 : -1;
      break;
    case Kind::kDir:
      rc = ::mkdir(p.c_str(), 0700);
      break;
    case Kind::kLink:
      rc = ::symlink("target", p.c_str());
      break;
    case Kind::kFifo:
      rc = ::mkfifo(p.c_str(), 0600);
      break;
    case Kind::kSock:
      rc = ::mknod(p.c_str(), S_IFSOCK | 0600, 0);
      break;
    // /dev/null's numbers; a block device with numbers no driver has.
    case Kind::kChr:
      rc = ::mknod(p.c_str(), S_IFCHR | 0600, makedev(1, 3));
      break;
    case Kind::kBlk:
      rc = ::mknod(p.c_str(), S_IFBLK | 0600, makedev(7, 250));
      break;
  }
  ASSERT_EQ(rc, 0) << p << ": " << std::strerror(errno);
  ASSERT_EQ(::lchown(p.c_str(), uid, gid), 0) << p;
  if (k != Kind::kLink) {
    ASSERT_EQ(::chmod(p.c_str(), mode), 0) << p;
  }
}

std::string errName(int e) {
  if (e == 0) return "ok";
  const char* n = strerrorname_np(e);
  return n ? n : std::to_string(e);
}

std::string outcome(long rc) { return errName(rc == -1 ? errno : 0); }

std::string describe(const std::string& p);

// The outcome of `call`, then the state of `p` after it (in that order:
// the operands of + are not sequenced).
std::string then(const std::function<long()>& call, const std::string& p) {
  std::string r = outcome(call());
  return r + " " + describe(p);
}

// What lstat shows of `p`, leaving out what legitimately differs between
// file systems (inode numbers, times, blocks, a directory's size and links).
std::string describe(const std::string& p) {
  struct stat st;
  if (::lstat(p.c_str(), &st) != 0) return "absent(" + errName(errno) + ")";
  std::string s = fmt::format("type={:o} mode={:o} uid={} gid={}", st.st_mode & S_IFMT,
                              st.st_mode & 07777, st.st_uid, st.st_gid);
  if (!S_ISDIR(st.st_mode)) s += fmt::format(" nlink={} size={}", st.st_nlink, st.st_size);
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode))
    s += fmt::format(" rdev={}:{}", major(st.st_rdev), minor(st.st_rdev));
  return s;
}

int openClose(const std::string& p, int flags) {
  int fd = ::open(p.c_str(), flags | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  ::close(fd);
  return 0;
}

// --- the cases ---------------------------------------------------------------

struct Who {
  const char* name;
  uid_t uid;
  gid_t gid;
};
constexpr Who kRootWho{"Root", 0, 0};
constexpr Who kOwnerWho{"Owner", kUser, kUserGroup};
constexpr Who kOtherWho{"Other", kOther, kOtherGroup};

struct OracleCase {
  std::string name;
  // As root in the case's directory `d` (mode 0777, owned by root).
  std::function<void(const std::string& d)> setup;
  Who who;
  // As `who`; returns what it saw (outcomes and states, as text).
  std::function<std::string(const std::string& d)> step;
};

// The operations applied to a node "n" of each kind; "target" and "other"
// (a regular file) and "sub" (an empty directory) exist beside it.
struct NodeOp {
  const char* name;
  std::function<std::string(const std::string& d)> step;
};

// gtest names a failed case by this rather than by its bytes.
void PrintTo(const OracleCase& c, std::ostream* os) { *os << c.name; }

std::vector<NodeOp> nodeOps() {
  auto n = [](const std::string& d) { return d + "/n"; };
  const timespec explicit_times[2] = {{1000, 0}, {2000, 0}};
  const timespec now_now[2] = {{0, UTIME_NOW}, {0, UTIME_NOW}};
  const timespec now_omit[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};
  std::vector<NodeOp> ops = {
      {"Lstat", [=](auto& d) { return describe(n(d)); }},
      {"StatFollows",
       [=](auto& d) {
         struct stat st;
         return outcome(::stat(n(d).c_str(), &st));
       }},
      {"Chmod",
       [=](auto& d) {
         return then([&] { return static_cast<long>(::chmod(n(d).c_str(), 0640)); }, n(d));
       }},
      {"ChmodSetgid",
       [=](auto& d) {
         return then([&] { return static_cast<long>(::chmod(n(d).c_str(), 02755)); }, n(d));
       }},
      {"ChownToSelf",
       [=](auto& d) {
         return then(
             [&] { return static_cast<long>(::lchown(n(d).c_str(), ::getuid(), ::getgid())); },
             n(d));
       }},
      {"ChownToOther",
       [=](auto& d) {
         return then([&] { return static_cast<long>(::lchown(n(d).c_str(), 4321, 4321)); }, n(d));
       }},
      {"ChgrpOnly",
       [=](auto& d) {
         return then([&] { return static_cast<long>(::lchown(n(d).c_str(), -1, ::getgid())); },
                     n(d));
       }},
      {"Link",
       [=](auto& d) {
         return then([&] { return static_cast<long>(::link(n(d).c_str(), (d + "/n2").c_str())); },
                     d + "/n2");
       }},
      {"Rename",
       [=](auto& d) {
         std::string r =
             then([&] { return static_cast<long>(::rename(n(d).c_str(), (d + "/m").c_str())); },
                  d + "/m");
         return r + " | " + describe(n(d));
       }},
      {"RenameOverFile",
       [=](auto& d) {
         return then(
             [&] { return static_cast<long>(::rename(n(d).c_str(), (d + "/other").c_str())); },
             d + "/other");
       }},
      {"RenameOverEmptyDir",
       [=](auto& d) {
         return then(
             [&] { return static_cast<long>(::rename(n(d).c_str(), (d + "/sub").c_str())); },
             d + "/sub");
       }},
      {"RenameFileOver",
       [=](auto& d) {
         return then(
             [&] { return static_cast<long>(::rename((d + "/other").c_str(), n(d).c_str())); },
             n(d));
       }},
      {"Unlink",
       [=](auto& d) {
         return then([&] { return static_cast<long>(::unlink(n(d).c_str())); }, n(d));
       }},
      {"Rmdir",
       [=](auto& d) {
         return then([&] { return static_cast<long>(::rmdir(n(d).c_str())); }, n(d));
       }},
      {"Truncate",
       [=](auto& d) {
         return then([&] { return static_cast<long>(::truncate(n(d).c_str(), 2)); }, n(d));
       }},
      {"TruncateHuge", [=](auto& d) { return outcome(::truncate(n(d).c_str(), 1LL << 62)); }},
      {"TruncateNegative", [=](auto& d) { return outcome(::truncate(n(d).c_str(), -1)); }},
      {"UtimesExplicit",
       [=](auto& d) {
         return outcome(::utimensat(AT_FDCWD, n(d).c_str(), explicit_times, AT_SYMLINK_NOFOLLOW));
       }},
      {"UtimesNow",
       [=](auto& d) { return outcome(::utimensat(AT_FDCWD, n(d).c_str(), now_now, 0)); }},
      {"UtimesNull",
       [=](auto& d) {
         return outcome(::utimensat(AT_FDCWD, n(d).c_str(), nullptr, AT_SYMLINK_NOFOLLOW));
       }},
      {"UtimesNowOmit",
       [=](auto& d) { return outcome(::utimensat(AT_FDCWD, n(d).c_str(), now_omit, 0)); }},
      {"OpenReadNonblock",
       [=](auto& d) { return outcome(openClose(n(d), O_RDONLY | O_NONBLOCK)); }},
      {"OpenWriteNonblock",
       [=](auto& d) { return outcome(openClose(n(d), O_WRONLY | O_NONBLOCK)); }},
      {"OpenNoFollow",
       [=](auto& d) { return outcome(openClose(n(d), O_RDONLY | O_NOFOLLOW | O_NONBLOCK)); }},
      {"OpenDirectoryFlag",
       [=](auto& d) { return outcome(openClose(n(d), O_RDONLY | O_DIRECTORY | O_NONBLOCK)); }},
      {"OpenTrunc",
       [=](auto& d) {
         return then(
             [&] { return static_cast<long>(openClose(n(d), O_WRONLY | O_TRUNC | O_NONBLOCK)); },
             n(d));
       }},
      {"CreateExcl",
       [=](auto& d) { return outcome(openClose(n(d), O_WRONLY | O_CREAT | O_EXCL)); }},
      {"Mkfifo", [=](auto& d) { return outcome(::mkfifo(n(d).c_str(), 0644)); }},
      {"Mkdir", [=](auto& d) { return outcome(::mkdir(n(d).c_str(), 0755)); }},
      {"Symlink", [=](auto& d) { return outcome(::symlink("x", n(d).c_str())); }},
      {"ChildOpen", [=](auto& d) { return outcome(openClose(n(d) + "/x", O_RDONLY)); }},
      {"ChildCreate", [=](auto& d) { return outcome(openClose(n(d) + "/x", O_WRONLY | O_CREAT)); }},
      {"ChildMkdir", [=](auto& d) { return outcome(::mkdir((n(d) + "/x").c_str(), 0755)); }},
      {"Readlink",
       [=](auto& d) {
         char buf[64];
         ssize_t got = ::readlink(n(d).c_str(), buf, sizeof buf);
         return outcome(got) + (got > 0 ? " " + std::string(buf, static_cast<size_t>(got)) : "");
       }},
      {"AccessR", [=](auto& d) { return outcome(::access(n(d).c_str(), R_OK)); }},
      {"AccessW", [=](auto& d) { return outcome(::access(n(d).c_str(), W_OK)); }},
      {"AccessX", [=](auto& d) { return outcome(::access(n(d).c_str(), X_OK)); }},
      {"SetUserXattr",
       [=](auto& d) { return outcome(::lsetxattr(n(d).c_str(), "user.k", "v", 1, 0)); }},
      {"SetTrustedXattr",
       [=](auto& d) { return outcome(::lsetxattr(n(d).c_str(), "trusted.k", "v", 1, 0)); }},
      {"GetMissingXattr",
       [=](auto& d) {
         char buf[8];
         return outcome(::lgetxattr(n(d).c_str(), "user.none", buf, sizeof buf));
       }},
      {"Opendir",
       [=](auto& d) {
         DIR* dd = ::opendir(n(d).c_str());
         if (!dd) return errName(errno);
         ::closedir(dd);
         return std::string("ok");
       }},
  };
  return ops;
}

// Each operation on each kind of node, by root, by the node's owner and by
// someone else. The node's mode is 0644 (0755 for directories).
void addNodeCases(std::vector<OracleCase>* out) {
  for (Kind k : kAllKinds) {
    for (const Who& who : {kRootWho, kOwnerWho, kOtherWho}) {
      for (const NodeOp& op : nodeOps()) {
        OracleCase c;
        c.name = fmt::format("{}_{}_{}", kindName(k), op.name, who.name);
        c.who = who;
        c.setup = [k](const std::string& d) {
          makeNode(d + "/target", Kind::kReg, 0644, kUser, kUserGroup);
          makeNode(d + "/other", Kind::kReg, 0666, 0, 0);
          ASSERT_EQ(::mkdir((d + "/sub").c_str(), 0777), 0);
          makeNode(d + "/n", k, k == Kind::kDir ? 0755 : 0644, kUser, kUserGroup);
        };
        c.step = op.step;
        out->push_back(std::move(c));
      }
    }
  }
}

// Removing and renaming in a sticky directory (mode 01777), for nodes of
// each kind owned by the caller, by someone else, and in a directory the
// caller owns.
void addStickyCases(std::vector<OracleCase>* out) {
  struct Layout {
    const char* name;
    uid_t dir_owner;
    uid_t node_owner;
  } layouts[] = {{"OthersNode", 0, kOther}, {"OwnNode", 0, kUser}, {"OwnDir", kUser, kOther}};
  for (Kind k : kAllKinds) {
    for (const Layout& l : layouts) {
      auto setup = [k, l](const std::string& d) {
        ASSERT_EQ(::mkdir((d + "/t").c_str(), 0777), 0);
        ASSERT_EQ(::chown((d + "/t").c_str(), l.dir_owner, l.dir_owner), 0);
        ASSERT_EQ(::chmod((d + "/t").c_str(), 01777), 0);
        makeNode(d + "/t/n", k, k == Kind::kDir ? 0777 : 0666, l.node_owner, l.node_owner);
        makeNode(d + "/t/mine", Kind::kReg, 0666, kUser, kUserGroup);
      };
      auto add = [&](const char* op, std::function<std::string(const std::string&)> step) {
        out->push_back({fmt::format("Sticky_{}_{}_{}", kindName(k), l.name, op), setup, kOwnerWho,
                        std::move(step)});
      };
      add("Remove", [k](const std::string& d) {
        std::string p = d + "/t/n";
        return then(
            [&] {
              return static_cast<long>(k == Kind::kDir ? ::rmdir(p.c_str()) : ::unlink(p.c_str()));
            },
            p);
      });
      add("RenameAway", [](const std::string& d) {
        return outcome(::rename((d + "/t/n").c_str(), (d + "/t/m").c_str()));
      });
      add("RenameOver", [](const std::string& d) {
        return then(
            [&] {
              return static_cast<long>(::rename((d + "/t/mine").c_str(), (d + "/t/n").c_str()));
            },
            d + "/t/n");
      });
      add("Exchange", [](const std::string& d) {
        return outcome(::renameat2(AT_FDCWD, (d + "/t/mine").c_str(), AT_FDCWD,
                                   (d + "/t/n").c_str(), RENAME_EXCHANGE));
      });
    }
  }
}

// utimensat's rules on a regular file: the owner sets any times; someone
// with write permission only "now" (both NOW, or NULL); others nothing.
void addUtimeCases(std::vector<OracleCase>* out) {
  struct Times {
    const char* name;
    timespec t[2];
    bool null;
  } times[] = {{"Null", {}, true},
               {"NowNow", {{0, UTIME_NOW}, {0, UTIME_NOW}}, false},
               {"NowOmit", {{0, UTIME_NOW}, {0, UTIME_OMIT}}, false},
               {"OmitNow", {{0, UTIME_OMIT}, {0, UTIME_NOW}}, false},
               {"OmitOmit", {{0, UTIME_OMIT}, {0, UTIME_OMIT}}, false},
               {"Explicit", {{5, 0}, {6, 0}}, false},
               {"ExplicitAndNow", {{5, 0}, {0, UTIME_NOW}}, false},
               {"BadNsec", {{5, 1'000'000'000}, {6, 0}}, false}};
  struct File {
    const char* name;
    mode_t mode;
    uid_t owner;
  } files[] = {{"Owned", 0444, kUser}, {"Writable", 0666, 0}, {"ReadOnly", 0644, 0}};
  for (const Times& tm : times) {
    for (const File& f : files) {
      out->push_back(
          {fmt::format("Utimens_{}_{}", tm.name, f.name),
           [f](const std::string& d) { makeNode(d + "/f", Kind::kReg, f.mode, f.owner, f.owner); },
           kOwnerWho,
           [tm](const std::string& d) {
             return outcome(::utimensat(AT_FDCWD, (d + "/f").c_str(), tm.null ? nullptr : tm.t, 0));
           }});
    }
  }
}

// Which error a path reports when several apply, and from where.
void addPathCases(std::vector<OracleCase>* out) {
  auto setup = [](const std::string& d) {
    makeNode(d + "/file", Kind::kReg, 0644, 0, 0);
    ASSERT_EQ(::mkdir((d + "/closed").c_str(), 0700), 0);  // root's, no search for others
    makeNode(d + "/closed/f", Kind::kReg, 0644, 0, 0);
    ASSERT_EQ(::mkdir((d + "/open").c_str(), 0755), 0);
    ASSERT_EQ(::symlink("file", (d + "/tofile").c_str()), 0);
    ASSERT_EQ(::symlink("missing", (d + "/dangling").c_str()), 0);
    ASSERT_EQ(::symlink("loop", (d + "/loop").c_str()), 0);
  };
  const char* paths[] = {"missing/x",      "file/x",        "file/missing/x", "closed/f",
                         "closed/missing", "closed/f/x",    "missing/file",   "tofile/x",
                         "dangling",       "dangling/x",    "loop",           "loop/x",
                         "open/missing",   "file/.",        "file/..",        "open/../file",
                         "closed/..",      "open//missing/"};
  struct PathOp {
    const char* name;
    std::function<long(const std::string&)> call;
  } ops[] = {
      {"Stat",
       [](const std::string& p) {
         struct stat st;
         return static_cast<long>(::stat(p.c_str(), &st));
       }},
      {"Open", [](const std::string& p) { return static_cast<long>(openClose(p, O_RDONLY)); }},
      {"Create",
       [](const std::string& p) { return static_cast<long>(openClose(p, O_WRONLY | O_CREAT)); }},
      {"Mkdir", [](const std::string& p) { return static_cast<long>(::mkdir(p.c_str(), 0755)); }},
      {"Unlink", [](const std::string& p) { return static_cast<long>(::unlink(p.c_str())); }}};
  for (const Who& who : {kRootWho, kOtherWho}) {
    for (const char* path : paths) {
      for (const PathOp& op : ops) {
        std::string name = path;
        for (char& ch : name)
          if (ch == '/' || ch == '.') ch = '_';
        out->push_back({fmt::format("Path_{}_{}_{}", op.name, name, who.name), setup, who,
                        [path, call = op.call](const std::string& d) {
                          return outcome(call(d + "/" + path));
                        }});
      }
    }
  }
  std::string long_name(NAME_MAX + 1, 'n');
  out->push_back(
      {"Path_NameTooLongBeatsMissing", setup, kRootWho, [long_name](const std::string& d) {
         return outcome(openClose(d + "/missing/" + long_name, O_RDONLY)) + " " +
                outcome(openClose(d + "/" + long_name, O_WRONLY | O_CREAT));
       }});
}

// Writes and sizes at the edges: past ext4's 16 TiB and cistern's 256 TiB
// limits both refuse (EFBIG); in range both take it.
void addSizeCases(std::vector<OracleCase>* out) {
  auto setup = [](const std::string& d) { makeNode(d + "/f", Kind::kReg, 0666, 0, 0); };
  for (const Who& who : {kRootWho, kOtherWho}) {
    out->push_back(
        {fmt::format("Size_WriteAtHugeOffset_{}", who.name), setup, who, [](const std::string& d) {
           int fd = ::open((d + "/f").c_str(), O_WRONLY);
           if (fd < 0) return errName(errno);
           std::string r = outcome(::pwrite(fd, "x", 1, 1LL << 60));
           ::close(fd);
           return r + " " + describe(d + "/f");
         }});
    out->push_back(
        {fmt::format("Size_TruncateTo1GiB_{}", who.name), setup, who, [](const std::string& d) {
           return then([&] { return static_cast<long>(::truncate((d + "/f").c_str(), 1LL << 30)); },
                       d + "/f");
         }});
    out->push_back(
        {fmt::format("Size_FtruncateHuge_{}", who.name), setup, who, [](const std::string& d) {
           int fd = ::open((d + "/f").c_str(), O_WRONLY);
           if (fd < 0) return errName(errno);
           std::string r = outcome(::ftruncate(fd, 1LL << 61));
           ::close(fd);
           return r;
         }});
  }
}

// Directory edge cases: renames into a subtree or over non-empty
// directories, "." and "..", trailing slashes, links of directories,
// exclusive creates through symlinks, opens of directories for writing.
void addDirCases(std::vector<OracleCase>* out) {
  auto setup = [](const std::string& d) {
    for (const char* dir : {"a", "a/sub", "b", "full", "empty"})
      ASSERT_EQ(::mkdir((d + "/" + dir).c_str(), 0777), 0);
    makeNode(d + "/full/x", Kind::kReg, 0644, 0, 0);
    makeNode(d + "/file", Kind::kReg, 0666, 0, 0);
    ASSERT_EQ(::symlink("nowhere", (d + "/dangling").c_str()), 0);
    ASSERT_EQ(::symlink("a", (d + "/todir").c_str()), 0);
  };
  struct Step {
    const char* name;
    std::function<long(const std::string&)> call;
  } steps[] = {
      {"RenameIntoOwnSubtree",
       [](const std::string& d) { return ::rename((d + "/a").c_str(), (d + "/a/sub/a").c_str()); }},
      {"RenameOverNonEmptyDir",
       [](const std::string& d) { return ::rename((d + "/a").c_str(), (d + "/full").c_str()); }},
      {"RenameOverEmptyDir",
       [](const std::string& d) { return ::rename((d + "/a").c_str(), (d + "/empty").c_str()); }},
      {"RenameDirOverFile",
       [](const std::string& d) { return ::rename((d + "/a").c_str(), (d + "/file").c_str()); }},
      {"RenameFileOverDir",
       [](const std::string& d) {
         return ::rename((d + "/file").c_str(), (d + "/empty").c_str());
       }},
      {"RenameDot",
       [](const std::string& d) { return ::rename((d + "/a/.").c_str(), (d + "/c").c_str()); }},
      {"RenameOntoDotDot",
       [](const std::string& d) { return ::rename((d + "/b").c_str(), (d + "/a/..").c_str()); }},
      {"RenameToSelf",
       [](const std::string& d) { return ::rename((d + "/a").c_str(), (d + "/a").c_str()); }},
      {"ExchangeDirAndFile",
       [](const std::string& d) {
         return static_cast<long>(::renameat2(AT_FDCWD, (d + "/a").c_str(), AT_FDCWD,
                                              (d + "/file").c_str(), RENAME_EXCHANGE));
       }},
      {"RmdirNonEmpty", [](const std::string& d) { return ::rmdir((d + "/full").c_str()); }},
      {"RmdirDot", [](const std::string& d) { return ::rmdir((d + "/a/.").c_str()); }},
      {"RmdirDotDot", [](const std::string& d) { return ::rmdir((d + "/a/sub/..").c_str()); }},
      {"RmdirSymlinkToDir", [](const std::string& d) { return ::rmdir((d + "/todir").c_str()); }},
      {"UnlinkDir", [](const std::string& d) { return ::unlink((d + "/empty").c_str()); }},
      {"LinkDir",
       [](const std::string& d) { return ::link((d + "/a").c_str(), (d + "/a2").c_str()); }},
      {"MkdirTrailingSlash",
       [](const std::string& d) { return ::mkdir((d + "/new/").c_str(), 0755); }},
      {"MkdirExisting", [](const std::string& d) { return ::mkdir((d + "/a").c_str(), 0755); }},
      {"CreateTrailingSlash",
       [](const std::string& d) {
         return static_cast<long>(openClose(d + "/newf/", O_WRONLY | O_CREAT));
       }},
      {"ExclCreateOnDanglingSymlink",
       [](const std::string& d) {
         return static_cast<long>(openClose(d + "/dangling", O_WRONLY | O_CREAT | O_EXCL));
       }},
      {"CreateThroughDanglingSymlink",
       [](const std::string& d) {
         return static_cast<long>(openClose(d + "/dangling", O_WRONLY | O_CREAT));
       }},
      {"OpenDirWrite",
       [](const std::string& d) { return static_cast<long>(openClose(d + "/a", O_WRONLY)); }},
      {"OpenDirCreat",
       [](const std::string& d) {
         return static_cast<long>(openClose(d + "/a", O_RDONLY | O_CREAT));
       }},
      {"SymlinkOverDir", [](const std::string& d) { return ::symlink("x", (d + "/a").c_str()); }},
      {"SymlinkEmptyTarget",
       [](const std::string& d) { return ::symlink("", (d + "/e").c_str()); }},
  };
  for (const Who& who : {kRootWho, kOtherWho}) {
    for (const Step& step : steps) {
      out->push_back({fmt::format("Tree_{}_{}", step.name, who.name), setup, who,
                      [call = step.call](const std::string& d) {
                        std::string r = outcome(call(d));
                        return r + " a:" + describe(d + "/a") + " file:" + describe(d + "/file");
                      }});
    }
  }
}

std::vector<OracleCase> allCases() {
  std::vector<OracleCase> out;
  addDirCases(&out);
  addNodeCases(&out);
  addStickyCases(&out);
  addUtimeCases(&out);
  addPathCases(&out);
  addSizeCases(&out);
  return out;
}

// --- running a case on both sides ---------------------------------------------

// The local ext4 directory the mount is compared with (beside the mount's data).
const std::string& localRoot() {
  static const std::string root = [] {
    char tmpl[] = "/tmp/cistern-oracle-XXXXXX";
    std::string r = ::mkdtemp(tmpl) ? tmpl : "";
    if (!r.empty()) ::chmod(r.c_str(), 0755);
    return r;
  }();
  return root;
}

// Runs `step` as `who` in a child process and returns what it printed.
std::string runAs(const Who& who, const std::function<std::string()>& step) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    if (who.uid != 0) {
      if (::setgroups(0, nullptr) != 0 || ::setgid(who.gid) != 0 || ::setuid(who.uid) != 0)
        _exit(250);
    }
    std::string r = step();
    (void)!::write(fds[1], r.data(), r.size());
    _exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) out += " <child failed>";
  return out;
}

std::string runOn(const std::string& root, const OracleCase& c) {
  std::string d = root + "/" + c.name;
  if (::mkdir(d.c_str(), 0777) != 0 || ::chmod(d.c_str(), 0777) != 0)
    return "mkdir " + d + ": " + std::strerror(errno);
  c.setup(d);
  if (::testing::Test::HasFatalFailure()) return "setup failed";
  return runAs(c.who, [&] { return c.step(d); });
}

class Oracle : public ::testing::TestWithParam<OracleCase> {
 public:
  static void TearDownTestSuite() {
    if (!localRoot().empty()) (void)std::system(("rm -rf " + localRoot()).c_str());
  }
};

TEST_P(Oracle, MountAnswersAsExt4) {
  const OracleCase& c = GetParam();
  ASSERT_FALSE(localRoot().empty()) << "no local directory for the oracle";
  struct statfs fs;
  ASSERT_EQ(::statfs(localRoot().c_str(), &fs), 0);
  if (fs.f_type != EXT4_SUPER_MAGIC)
    GTEST_SKIP() << localRoot() << " is not on ext4: the oracle is missing";
  std::string want = runOn(localRoot(), c);
  std::string got = runOn(MountEnv::get().mnt(), c);
  EXPECT_EQ(got, want) << c.name << " (left: the mount, right: ext4)";
  if (std::getenv("CISTERN_ORACLE_VERBOSE")) std::printf("%s: %s\n", c.name.c_str(), got.c_str());
}

INSTANTIATE_TEST_SUITE_P(Ext4, Oracle, ::testing::ValuesIn(allCases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace cistern::testing
