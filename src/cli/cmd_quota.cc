// `cistern quota set|get|ls|rm` and `cistern tenant set` (docs/quota.md):
// limits on the bytes and inodes of a directory's subtree, or a tenant's.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cctype>

#include "cli/commands.h"
#include "cli/remote.h"

namespace cistern::cli {
namespace {

// "10G", "512M", "4096", "1.5T" (binary units): kInvalidArgument otherwise.
Result<uint64_t> parseSize(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    used = 0;
  }
  std::string unit = text.substr(used);
  uint64_t scale = 1;
  if (unit.size() == 1 || (unit.size() == 3 && unit.substr(1) == "iB")) {
    switch (std::toupper(static_cast<unsigned char>(unit[0]))) {
      case 'K':
        scale = 1ull << 10;
        break;
      case 'M':
        scale = 1ull << 20;
        break;
      case 'G':
        scale = 1ull << 30;
        break;
      case 'T':
        scale = 1ull << 40;
        break;
      case 'P':
        scale = 1ull << 50;
        break;
      default:
        used = 0;
    }
  } else if (!unit.empty()) {
    used = 0;
  }
  if (used == 0 || v < 0 || v * static_cast<double>(scale) > 1.8e19) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("'{}' is not a size (digits, then K, M, G, T or P)", text));
  }
  return static_cast<uint64_t>(v * static_cast<double>(scale));
}

void printQuota(const std::string& name, const QuotaInfo& q) {
  auto limit = [](uint64_t max, bool bytes) {
    return max == 0 ? std::string("-")
           : bytes  ? humanBytes(static_cast<double>(max))
                    : std::to_string(max);
  };
  fmt::print("{:<32} {:>12} {:>12} {:>12} {:>12}\n", name,
             humanBytes(static_cast<double>(q.bytes_used)), limit(q.bytes_max, true), q.inodes_used,
             limit(q.inodes_max, false));
}

void printHeader() {
  fmt::print("{:<32} {:>12} {:>12} {:>12} {:>12}\n", "DIRECTORY", "BYTES", "LIMIT", "INODES",
             "LIMIT");
}

struct Limits {
  std::string bytes, inodes;
};

// The limits given (an unset one keeps `current`'s); false after reporting a bad one.
bool limitsOf(const Limits& given, const QuotaInfo& current, uint64_t* bytes, uint64_t* inodes) {
  *bytes = current.bytes_max;
  *inodes = current.inodes_max;
  if (!given.bytes.empty()) {
    auto b = parseSize(given.bytes);
    if (!b.ok()) {
      fmt::print(stderr, "cistern: --bytes: {}\n", b.status().message());
      setExitCode(2);
      return false;
    }
    *bytes = *b;
  }
  if (!given.inodes.empty()) {
    auto i = parseSize(given.inodes);
    if (!i.ok()) {
      fmt::print(stderr, "cistern: --inodes: {}\n", i.status().message());
      setExitCode(2);
      return false;
    }
    *inodes = *i;
  }
  if (*bytes == 0 && *inodes == 0) {
    fmt::print(stderr, "cistern: give --bytes or --inodes (quota rm removes a quota)\n");
    setExitCode(2);
    return false;
  }
  return true;
}

}  // namespace

void addQuotaCommands(CLI::App& app) {
  auto* cmd = app.add_subcommand("quota", "limits on a directory's bytes and inodes");
  cmd->require_subcommand(1);
  {
    auto* set = cmd->add_subcommand("set", "set (or change) a directory's quota");
    auto& flags = addClusterFlags(set);
    static std::string path;
    static Limits limits;
    set->add_option("DIR", path, "the directory")->required();
    set->add_option("--bytes", limits.bytes, "bytes its subtree may hold (e.g. 100G)");
    set->add_option("--inodes", limits.inodes, "files and directories it may hold (e.g. 1M)");
    set->callback([&flags] {
      auto c = connectOrReport(flags);
      if (!c) return;
      FileInfo dir;
      if (report(c->stat(remotePath(path), &dir))) return;
      QuotaInfo current;
      (void)c->quotaGet(dir.ino, &current);  // absent: all limits unset
      uint64_t bytes = 0, inodes = 0;
      if (!limitsOf(limits, current, &bytes, &inodes)) return;
      QuotaInfo q;
      if (report(c->quotaSet(dir.ino, bytes, inodes, &q))) return;
      printHeader();
      printQuota(remotePath(path), q);
    });
  }
  {
    auto* get = cmd->add_subcommand("get", "a directory's quota and use");
    auto& flags = addClusterFlags(get);
    static std::string path;
    get->add_option("DIR", path, "the directory")->required();
    get->callback([&flags] {
      auto c = connectOrReport(flags);
      if (!c) return;
      FileInfo dir;
      if (report(c->stat(remotePath(path), &dir))) return;
      QuotaInfo q;
      if (report(c->quotaGet(dir.ino, &q))) return;
      printHeader();
      printQuota(remotePath(path), q);
    });
  }
  {
    auto* ls = cmd->add_subcommand("ls", "every quota (a tenant's token: those in its subtree)");
    auto& flags = addClusterFlags(ls);
    ls->callback([&flags] {
      auto c = connectOrReport(flags);
      if (!c) return;
      std::vector<QuotaInfo> all;
      if (report(c->quotaList(&all))) return;
      printHeader();
      for (const auto& q : all) printQuota(fmt::format("inode {}", q.dir), q);
    });
  }
  {
    auto* rm = cmd->add_subcommand("rm", "remove a directory's quota");
    auto& flags = addClusterFlags(rm);
    static std::string path;
    rm->add_option("DIR", path, "the directory")->required();
    rm->callback([&flags] {
      auto c = connectOrReport(flags);
      if (!c) return;
      FileInfo dir;
      if (report(c->stat(remotePath(path), &dir))) return;
      report(c->quotaSet(dir.ino, 0, 0, nullptr));
    });
  }
}

void addTenantQuotaCommand(CLI::App& tenant) {
  auto* set = tenant.add_subcommand("set", "set a tenant's quota (its root directory's)");
  auto& flags = addClusterFlags(set);
  static std::string name;
  static Limits limits;
  set->add_option("NAME", name, "the tenant")->required();
  set->add_option("--bytes", limits.bytes, "bytes the tenant may hold (e.g. 10T)");
  set->add_option("--inodes", limits.inodes, "files and directories it may hold (e.g. 100M)");
  set->callback([&flags] {
    auto c = connectOrReport(flags);
    if (!c) return;
    std::vector<TenantInfo> all;
    if (report(c->tenantList(&all))) return;
    const TenantInfo* t = nullptr;
    for (const auto& one : all)
      if (one.name == name) t = &one;
    if (!t) {
      fmt::print(stderr, "cistern: tenant {}: no such tenant\n", name);
      setExitCode(1);
      return;
    }
    QuotaInfo current;
    (void)c->quotaGet(t->root, &current);
    uint64_t bytes = 0, inodes = 0;
    if (!limitsOf(limits, current, &bytes, &inodes)) return;
    QuotaInfo q;
    if (report(c->quotaSet(t->root, bytes, inodes, &q))) return;
    printHeader();
    printQuota("tenant " + name, q);
  });
}

}  // namespace cistern::cli
