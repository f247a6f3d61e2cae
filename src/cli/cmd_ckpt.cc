// cistern ckpt ls|show|verify|rm: checkpoints (docs/checkpoint_format.md)
// from the command line.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <ctime>
#include <set>

#include "ckpt/checkpoint.h"
#include "cli/commands.h"
#include "cli/remote.h"

namespace cistern::cli {
namespace {

std::string whenOf(int64_t ns) {
  std::time_t t = static_cast<std::time_t>(ns / 1'000'000'000);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

// Bytes held in the checkpoint's own files, and in others'.
std::pair<uint64_t, uint64_t> bytesOf(const ckpt::Manifest& m) {
  uint64_t own = 0, reused = 0;
  for (const auto& t : m.tensors) (t.in.empty() ? own : reused) += t.bytes;
  return {own, reused};
}

void ls(Client& c, const std::string& root) {
  auto names = ckpt::list(c, root);
  if (reportStatus(names.status(), root)) return;
  for (const std::string& n : *names) {
    const std::string path = root == "/" ? "/" + n : root + "/" + n;
    auto m = ckpt::readManifest(c, path);
    if (reportStatus(m.status(), path)) return;
    auto [own, reused] = bytesOf(*m);
    fmt::print("{}  {}  {} tensors  {} written  {} reused{}\n", whenOf(m->created_ns), n,
               m->tensors.size(), humanBytes(static_cast<double>(own)),
               humanBytes(static_cast<double>(reused)),
               m->base.empty() ? "" : fmt::format("  (base {})", m->base));
  }
}

void show(Client& c, const std::string& path) {
  auto m = ckpt::readManifest(c, path);
  if (reportStatus(m.status(), path)) return;
  auto [own, reused] = bytesOf(*m);
  fmt::print("{}: created {}, {} tensors, {} written, {} reused{}\n", path, whenOf(m->created_ns),
             m->tensors.size(), humanBytes(static_cast<double>(own)),
             humanBytes(static_cast<double>(reused)),
             m->base.empty() ? "" : fmt::format(", base {}", m->base));
  for (const auto& [k, v] : m->metadata) fmt::print("  metadata {} = {}\n", k, v);
  for (const auto& t : m->tensors) {
    fmt::print("  {}  {}  [{}]  {}  {}{}\n", t.name, ckpt::dtypeName(t.dtype),
               fmt::join(t.shape, ", "), humanBytes(static_cast<double>(t.bytes)), t.file,
               t.in.empty() ? "" : " in " + t.in);
  }
}

}  // namespace

void addCkptCommands(CLI::App& app) {
  auto* ckpt_cmd = app.add_subcommand("ckpt", "checkpoints: list, show, verify, remove");
  ckpt_cmd->require_subcommand(1);
  struct Spec {
    const char* name;
    const char* help;
    const char* arg;
  };
  static std::vector<std::string> args[4];
  const Spec specs[] = {
      {"ls", "list the committed checkpoints under ROOT, oldest first", "ROOT"},
      {"show", "the tensors of checkpoint PATH (name, dtype, shape, size, file)", "PATH"},
      {"verify", "read every tensor of checkpoint PATH and check its CRC32C", "PATH"},
      {"rm", "remove checkpoints (newer ones that reuse their files keep them)", "PATH..."},
  };
  for (int i = 0; i < 4; ++i) {
    const Spec& s = specs[i];
    auto* cmd = ckpt_cmd->add_subcommand(s.name, s.help);
    auto& flags = addClusterFlags(cmd);
    cmd->add_option(s.arg[0] == 'R' ? "root" : "path", args[i], s.arg)->required();
    const std::string which = s.name;
    cmd->callback([&flags, which, i] {
      auto c = connectOrReport(flags);
      if (!c) return;
      if (which != "rm" && args[i].size() != 1) {
        fmt::print(stderr, "cistern ckpt {}: one {} expected\n", which,
                   which == "ls" ? "ROOT" : "PATH");
        setExitCode(2);
        return;
      }
      const std::string p = remotePath(args[i][0]);
      if (which == "ls") return ls(*c, p);
      if (which == "show") return show(*c, p);
      if (which == "verify") {
        auto m = ckpt::readManifest(*c, p);
        if (reportStatus(m.status(), p)) return;
        if (reportStatus(ckpt::verify(*c, p), p)) return;
        fmt::print("{}: ok, {} tensors, {}\n", p, m->tensors.size(),
                   humanBytes(static_cast<double>(bytesOf(*m).first + bytesOf(*m).second)));
        return;
      }
      for (const std::string& a : args[i]) {
        const std::string path = remotePath(a);
        if (reportStatus(ckpt::remove(*c, path), path)) return;
      }
    });
  }
}

}  // namespace cistern::cli
