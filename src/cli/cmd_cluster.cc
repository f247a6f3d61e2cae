// Cluster commands: df, fsck (status and chains: cmd_status.cc).
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/remote.h"

namespace cistern::cli {

void addClusterCommands(CLI::App& app) {
  {
    auto* cmd = app.add_subcommand("df", "space and inodes of the cluster");
    auto& flags = addClusterFlags(cmd);
    cmd->callback([&flags] {
      auto c = connectOrReport(flags);
      if (!c) return;
      SpaceInfo s;
      if (report(c->statfs(&s))) return;
      if (!s.capacity_known) {
        fmt::print("capacity unknown; {} inodes used\n", s.inodes_used);
        return;
      }
      uint64_t used = s.bytes_total - s.bytes_free;
      fmt::print("{:>12} {:>12} {:>12} {:>5} {:>12}\n", "Size", "Used", "Avail", "Use%", "Inodes");
      fmt::print(
          "{:>12} {:>12} {:>12} {:>4}% {:>12}\n", humanBytes(static_cast<double>(s.bytes_total)),
          humanBytes(static_cast<double>(used)), humanBytes(static_cast<double>(s.bytes_free)),
          s.bytes_total ? used * 100 / s.bytes_total : 0, s.inodes_used);
    });
  }
  {
    auto* cmd = app.add_subcommand(
        "fsck", "check the namespace and the chunks in storage (read-only unless asked)");
    auto& flags = addClusterFlags(cmd);
    static bool remove_orphans = false;
    cmd->add_flag("--remove-orphan-chunks", remove_orphans,
                  "also remove the chunks that belong to no file");
    cmd->callback([&flags] {
      auto c = connectOrReport(flags);
      if (!c) return;
      CheckReport r;
      if (report(c->fsck(&r, remove_orphans))) return;
      for (const auto& p : r.problems) fmt::print("problem: {}\n", p);
      if (r.orphan_chunks_removed > 0)
        fmt::print("removed {} chunks of no file\n", r.orphan_chunks_removed);
      fmt::print(
          "{} inodes, {} dentries, {} open for writing, {} GC entries, {} chunks ({} past their "
          "file's end, {} of no file): {}\n",
          r.inodes, r.dentries, r.sessions, r.gc_entries, r.chunks, r.chunks_past_end,
          r.orphan_chunks,
          r.problems.empty() ? "clean" : fmt::format("{} problems", r.problems.size()));
      if (!r.problems.empty()) setExitCode(1);
    });
  }
}

}  // namespace cistern::cli
