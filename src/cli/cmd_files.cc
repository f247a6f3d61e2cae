// Namespace commands: ls, stat, mkdir, mknod, ln -s, rm, mv, cat.
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <ctime>

#include "cli/commands.h"
#include "cli/remote.h"

namespace cistern::cli {
namespace {

// As ls -l: the type letter, then rwx with set-ID and sticky bits (s/S, t/T).
std::string modeString(uint32_t mode) {
  std::string s;
  switch (mode & S_IFMT) {
    case S_IFDIR:
      s = "d";
      break;
    case S_IFLNK:
      s = "l";
      break;
    case S_IFIFO:
      s = "p";
      break;
    case S_IFSOCK:
      s = "s";
      break;
    case S_IFCHR:
      s = "c";
      break;
    case S_IFBLK:
      s = "b";
      break;
    default:
      s = "-";
      break;
  }
  const char* rwx = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i) s += (mode & (0400 >> i)) ? rwx[i] : '-';
  auto special = [&](size_t at, uint32_t bit, char set) {
    if (mode & bit) s[at] = s[at] == 'x' ? set : static_cast<char>(set - 'a' + 'A');
  };
  special(3, S_ISUID, 's');
  special(6, S_ISGID, 's');
  special(9, S_ISVTX, 't');
  return s;
}

const char* typeName(const FileInfo& f) {
  switch (f.mode & S_IFMT) {
    case S_IFDIR:
      return "directory";
    case S_IFREG:
      return "regular file";
    case S_IFLNK:
      return "symbolic link";
    case S_IFIFO:
      return "fifo";
    case S_IFSOCK:
      return "socket";
    case S_IFCHR:
      return "character special file";
    case S_IFBLK:
      return "block special file";
    default:
      return "unknown";
  }
}

bool isDevice(const FileInfo& f) { return S_ISCHR(f.mode) || S_ISBLK(f.mode); }

std::string timeString(int64_t ns) {
  time_t t = static_cast<time_t>(ns / 1000000000);
  struct tm tm;
  localtime_r(&t, &tm);
  char buf[64];
  strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return fmt::format("{}.{:09d}", buf, ns % 1000000000);
}

// One line of ls -l: a device's major, minor instead of a size, a
// symlink's target after its name.
void printLong(Client& c, const FileInfo& f, const std::string& name, const std::string& path) {
  std::string size =
      isDevice(f) ? fmt::format("{}, {}", major(f.rdev), minor(f.rdev)) : std::to_string(f.size);
  std::string shown = name;
  if (S_ISLNK(f.mode)) {
    std::string target;
    if (!c.readlink(path, &target)) shown += " -> " + target;
  }
  fmt::print("{} {:>3} {:>5} {:>5} {:>12} {} {}\n", modeString(f.mode), f.nlink, f.uid, f.gid, size,
             timeString(f.mtime_ns).substr(0, 16), shown);
}

// Removes path; with `recursive`, a directory's contents first.
bool removeTree(Client& c, const std::string& path, bool recursive, bool force) {
  FileInfo info;
  Error e = c.stat(path, &info);
  if (e) {
    if (force && e.errno_value == ENOENT) return true;
    return !report(e);
  }
  if (!info.isDir()) return !report(c.unlink(path));
  if (!recursive) return !report(Error{EISDIR, path + ": Is a directory"});
  std::vector<DirEntry> entries;
  if (report(c.list(path, &entries))) return false;
  bool ok = true;
  for (const auto& d : entries) {
    std::string child = path == "/" ? "/" + d.name : path + "/" + d.name;
    ok = removeTree(c, child, true, force) && ok;
  }
  if (path == "/") return ok;  // the root stays
  return !report(c.rmdir(path)) && ok;
}

}  // namespace

void addFileCommands(CLI::App& app) {
  {
    auto* cmd = app.add_subcommand("ls", "list directories");
    auto& flags = addClusterFlags(cmd);
    static bool lng = false;
    static std::vector<std::string> paths;
    cmd->add_flag("-l", lng, "long format");
    cmd->add_option("paths", paths, "remote paths (default /)");
    cmd->callback([&flags] {
      auto c = connectOrReport(flags);
      if (!c) return;
      if (paths.empty()) paths.push_back("/");
      for (const auto& raw : paths) {
        std::string p = remotePath(raw);
        FileInfo info;
        if (report(c->stat(p, &info))) continue;
        if (!info.isDir()) {
          if (lng)
            printLong(*c, info, raw, p);
          else
            fmt::print("{}\n", raw);
          continue;
        }
        std::vector<DirEntry> entries;
        if (report(c->list(p, &entries))) continue;
        if (paths.size() > 1) fmt::print("{}:\n", raw);
        for (const auto& d : entries) {
          if (lng)
            printLong(*c, d.info, d.name, (p == "/" ? "" : p) + "/" + d.name);
          else
            fmt::print("{}\n", d.name);
        }
      }
    });
  }
  {
    auto* cmd = app.add_subcommand("stat", "show a file's attributes");
    auto& flags = addClusterFlags(cmd);
    static std::vector<std::string> paths;
    cmd->add_option("paths", paths, "remote paths")->required();
    cmd->callback([&flags] {
      auto c = connectOrReport(flags);
      if (!c) return;
      for (const auto& raw : paths) {
        FileInfo f;
        if (report(c->stat(remotePath(raw), &f))) continue;
        fmt::print("  File: {}\n  Size: {:<12} Type: {}\n", raw, f.size, typeName(f));
        fmt::print("Inode: {:<12} Links: {}", f.ino, f.nlink);
        if (isDevice(f)) fmt::print("  Device type: {},{}", major(f.rdev), minor(f.rdev));
        fmt::print("\n");
        fmt::print("Access: ({:04o}/{})  Uid: {}  Gid: {}\n", f.mode & 07777, modeString(f.mode),
                   f.uid, f.gid);
        if (f.chunk_size) fmt::print("Chunk size: {}\n", f.chunk_size);
        fmt::print("Access: {}\nModify: {}\nChange: {}\n", timeString(f.atime_ns),
                   timeString(f.mtime_ns), timeString(f.ctime_ns));
      }
    });
  }
  {
    auto* cmd = app.add_subcommand("mkdir", "make directories");
    auto& flags = addClusterFlags(cmd);
    static bool parents = false;
    static std::string mode_text = "755";
    static std::vector<std::string> paths;
    cmd->add_flag("-p,--parents", parents, "make parents as needed; existing ones are fine");
    cmd->add_option("-m,--mode", mode_text, "permission bits, octal")->capture_default_str();
    cmd->add_option("paths", paths, "remote paths")->required();
    cmd->callback([&flags] {
      char* end = nullptr;
      unsigned long mode = std::strtoul(mode_text.c_str(), &end, 8);
      if (mode_text.empty() || *end != '\0' || mode > 07777) {
        report(Error{EINVAL, fmt::format("invalid mode '{}'", mode_text)});
        return;
      }
      auto c = connectOrReport(flags);
      if (!c) return;
      for (const auto& raw : paths)
        report(c->mkdir(remotePath(raw), static_cast<uint32_t>(mode), parents));
    });
  }
  {
    auto* cmd = app.add_subcommand("mknod", "make a FIFO or a device node (as mknod(1))");
    auto& flags = addClusterFlags(cmd);
    static std::string path, type, mode_text = "644";
    static uint32_t major_num = 0, minor_num = 0;
    cmd->add_option("path", path, "remote path")->required();
    cmd->add_option("type", type, "p (FIFO), c or u (character device), b (block device)")
        ->required();
    cmd->add_option("major", major_num, "a device's major number");
    cmd->add_option("minor", minor_num, "a device's minor number");
    cmd->add_option("-m,--mode", mode_text, "permission bits, octal")->capture_default_str();
    cmd->callback([&flags, cmd] {
      char* end = nullptr;
      unsigned long mode = std::strtoul(mode_text.c_str(), &end, 8);
      if (mode_text.empty() || *end != '\0' || mode > 07777) {
        report(Error{EINVAL, fmt::format("invalid mode '{}'", mode_text)});
        return;
      }
      uint32_t bits = type == "p"                    ? S_IFIFO
                      : type == "b"                  ? S_IFBLK
                      : (type == "c" || type == "u") ? S_IFCHR
                                                     : 0;
      if (bits == 0) {
        report(Error{EINVAL, fmt::format("invalid type '{}': p, b, c or u", type)});
        return;
      }
      bool numbers = cmd->count("major") + cmd->count("minor") > 0;
      if ((bits == S_IFIFO) == numbers || (numbers && cmd->count("minor") == 0)) {
        report(Error{EINVAL, bits == S_IFIFO ? "a FIFO takes no device numbers"
                                             : "a device needs its major and minor numbers"});
        return;
      }
      auto c = connectOrReport(flags);
      if (!c) return;
      report(c->mknod(remotePath(path), bits | static_cast<uint32_t>(mode),
                      makedev(major_num, minor_num)));
    });
  }
  {
    auto* cmd = app.add_subcommand("ln", "make a symbolic link (ln -s TARGET LINK)");
    auto& flags = addClusterFlags(cmd);
    static bool symbolic = false;
    static std::string target, link;
    cmd->add_flag("-s,--symbolic", symbolic, "a symbolic link (the only kind made here)");
    cmd->add_option("target", target, "what the link points to, stored as given")->required();
    cmd->add_option("link", link, "remote path of the new link")->required();
    cmd->callback([&flags] {
      if (!symbolic) {
        report(Error{EINVAL, "only symbolic links: cistern ln -s TARGET LINK"});
        return;
      }
      auto c = connectOrReport(flags);
      if (!c) return;
      report(c->symlink(target, remotePath(link)));
    });
  }
  {
    auto* cmd = app.add_subcommand("rm", "remove files or directories");
    auto& flags = addClusterFlags(cmd);
    static bool recursive = false, force = false;
    static std::vector<std::string> paths;
    cmd->add_flag("-r,-R,--recursive", recursive, "remove directories and their contents");
    cmd->add_flag("-f,--force", force, "ignore missing files");
    cmd->add_option("paths", paths, "remote paths")->required();
    cmd->callback([&flags] {
      auto c = connectOrReport(flags);
      if (!c) return;
      for (const auto& raw : paths) removeTree(*c, remotePath(raw), recursive, force);
    });
  }
  {
    auto* cmd = app.add_subcommand("mv", "rename a file or directory");
    auto& flags = addClusterFlags(cmd);
    static std::string from, to;
    cmd->add_option("from", from, "remote path")->required();
    cmd->add_option("to", to, "remote path; into it when it is a directory")->required();
    cmd->callback([&flags] {
      auto c = connectOrReport(flags);
      if (!c) return;
      std::string src = remotePath(from), dst = remotePath(to);
      FileInfo info;
      if (!c->stat(dst, &info) && info.isDir()) {
        std::string base = src.substr(src.find_last_of('/') + 1);
        dst = (dst == "/" ? "" : dst) + "/" + base;
      }
      report(c->rename(src, dst));
    });
  }
  {
    auto* cmd = app.add_subcommand("cat", "write files to stdout");
    auto& flags = addClusterFlags(cmd);
    static std::vector<std::string> paths;
    cmd->add_option("paths", paths, "remote paths")->required();
    cmd->callback([&flags] {
      auto c = connectOrReport(flags);
      if (!c) return;
      std::vector<char> buf(4 << 20);
      for (const auto& raw : paths) {
        std::unique_ptr<File> f;
        if (report(c->open(remotePath(raw), O_RDONLY, 0, &f))) continue;
        for (uint64_t off = 0;;) {
          size_t got = 0;
          if (report(f->pread(buf.data(), buf.size(), off, &got)) || got == 0) break;
          for (size_t w = 0; w < got;) {
            ssize_t n = ::write(1, buf.data() + w, got - w);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) {
              report(Error{errno, fmt::format("write error: {}", std::strerror(errno))});
              return;
            }
            w += static_cast<size_t>(n);
          }
          off += got;
        }
        report(f->close());
      }
    });
  }
}

}  // namespace cistern::cli
