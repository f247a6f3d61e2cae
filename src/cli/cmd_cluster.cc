// Cluster commands: df, status, fsck.
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
    auto* cmd = app.add_subcommand("status", "targets, chains, capacity and health");
    auto& flags = addClusterFlags(cmd);
    cmd->callback([&flags] {
      auto c = connectOrReport(flags);
      if (!c) return;
      std::vector<TargetInfo> targets;
      if (report(c->targets(&targets))) return;
      uint64_t total = 0, free_bytes = 0, chunks = 0, data = 0;
      int bad = 0;
      fmt::print("{:>6} {:>5} {:<22} {:<9} {:>10} {:>10} {:>10} {:>10} {:>12}  {}\n", "target",
                 "chain", "endpoint", "health", "fs size", "fs free", "kept", "chunks", "data",
                 "path");
      for (const auto& t : targets) {
        const char* health = !t.reachable ? "DOWN" : t.failed ? "FAILED" : "ok";
        if (!t.reachable || t.failed) ++bad;
        fmt::print("{:>6} {:>5} {:<22} {:<9} {:>10} {:>10} {:>10} {:>10} {:>12}  {}\n", t.id,
                   t.chain, t.endpoint, health, humanBytes(static_cast<double>(t.fs_total_bytes)),
                   humanBytes(static_cast<double>(t.fs_free_bytes)),
                   humanBytes(static_cast<double>(t.kept_bytes)), t.chunks,
                   humanBytes(static_cast<double>(t.data_bytes)), t.path);
        total += t.fs_total_bytes;
        free_bytes += t.fs_free_bytes;
        chunks += t.chunks;
        data += t.data_bytes;
      }
      fmt::print("{} targets, {} chains (replication 1), {} chunks, {} of data; {}\n",
                 targets.size(), targets.size(), chunks, humanBytes(static_cast<double>(data)),
                 bad == 0 ? "healthy" : fmt::format("{} target(s) unhealthy", bad));
      if (bad) setExitCode(1);
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
