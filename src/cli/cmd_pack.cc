// `cistern pack SRC DST`: a local directory tree into a pack in the cluster
// (docs/pack_format.md), files read by several threads, progress on stderr;
// `cistern pack --list PACK`, `cistern pack --verify PACK`;
// `cistern unpack PACK DST`: a pack back into a local directory tree.
#include <fmt/format.h>
#include <sys/stat.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "cli/commands.h"
#include "cli/remote.h"
#include "pack/pack.h"

namespace cistern::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

bool reportStatus(const Status& s, const std::string& what) {
  if (s.ok()) return false;
  fmt::print(stderr, "cistern: {}: {}\n", what, s.toString());
  setExitCode(1);
  return true;
}

// "12,345/100,000 files  1.2 GiB  310 MB/s  ETA 0:42" on one stderr line.
void progress(uint64_t files, uint64_t total, uint64_t bytes, Clock::time_point t0, bool last) {
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const double rate = secs > 0 ? static_cast<double>(bytes) / secs : 0;
  const double per_file = files > 0 ? secs / static_cast<double>(files) : 0;
  const auto eta = static_cast<uint64_t>(per_file * static_cast<double>(total - files));
  fmt::print(stderr, "\r{}/{} files  {}  {:.0f} MB/s  ETA {}:{:02}{}", files, total,
             humanBytes(static_cast<double>(bytes)), rate / 1e6, eta / 60, eta % 60,
             last ? "\n" : "   ");
}

struct Sample {
  std::string name;
  std::vector<uint8_t> bytes;
  int64_t mtime_ns = 0;
  Status status;
};

// Packs the regular files under `src` (names relative to it, '/'-separated),
// read by `threads` threads; at most `queue_bytes` read ahead of the writer.
Status packTree(Client& c, const std::string& src, const std::string& dst, bool append,
                uint64_t shard_bytes, int threads) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(src, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (it->is_regular_file()) files.push_back(it->path());
  }
  if (ec) return Status(ErrorCode::kIOError, fmt::format("{}: {}", src, ec.message()));
  std::sort(files.begin(), files.end());
  pack::WriterOptions o;
  o.shard_bytes = shard_bytes;
  ASSIGN_OR_RETURN(auto writer, pack::PackWriter::create(c, dst, o, append));
  // Readers fill slots in file order; the writer takes them in that order.
  constexpr uint64_t kQueueBytes = 256ull << 20;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Sample>> slots(files.size());
  std::atomic<size_t> next{0};
  uint64_t queued = 0;
  size_t want = 0;  // the file the writer waits for: always let in
  bool stop = false;
  std::vector<std::thread> readers;
  for (int t = 0; t < threads; ++t) {
    readers.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < files.size();) {
        auto s = std::make_unique<Sample>();
        s->name = fs::relative(files[i], src).generic_string();
        std::ifstream in(files[i], std::ios::binary);
        s->bytes.assign(std::istreambuf_iterator<char>(in), {});
        if (!in && !in.eof()) {
          s->status =
              Status(ErrorCode::kIOError, fmt::format("{}: read failed", files[i].string()));
        }
        struct stat st;
        if (::stat(files[i].c_str(), &st) == 0)
          s->mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stop || queued < kQueueBytes || i == want; });
        if (stop) return;
        queued += s->bytes.size();
        slots[i] = std::move(s);
        cv.notify_all();
      }
    });
  }
  Status result;
  uint64_t bytes = 0;
  const auto t0 = Clock::now();
  auto last_print = t0;
  for (size_t i = 0; i < files.size(); ++i) {
    std::unique_ptr<Sample> s;
    {
      std::unique_lock lock(mu);
      want = i;
      cv.notify_all();
      cv.wait(lock, [&] { return slots[i] != nullptr; });
      s = std::move(slots[i]);
      queued -= s->bytes.size();
      cv.notify_all();
    }
    result = s->status.ok() ? writer->add(s->name, s->bytes, s->mtime_ns) : s->status;
    if (!result.ok()) break;
    bytes += s->bytes.size();
    if (Clock::now() - last_print > std::chrono::milliseconds(250)) {
      progress(i + 1, files.size(), bytes, t0, false);
      last_print = Clock::now();
    }
  }
  {
    std::lock_guard lock(mu);
    stop = true;
    cv.notify_all();
  }
  for (auto& t : readers) t.join();
  RETURN_ON_ERROR(result);
  RETURN_ON_ERROR(writer->finish());
  progress(files.size(), files.size(), bytes, t0, true);
  return Status::OK();
}

Status listPack(Client& c, const std::string& path) {
  ASSIGN_OR_RETURN(auto r, pack::PackReader::open(c, path));
  for (uint64_t i = 0; i < r->size(); ++i) {
    ASSIGN_OR_RETURN(pack::Entry e, r->entry(i));
    ASSIGN_OR_RETURN(std::string name, r->name(e));
    fmt::print("{:>12} {}\n", e.length, name);
  }
  fmt::print(stderr, "{} samples in {} shards (index generation {})\n", r->size(),
             r->header().shards, r->header().generation);
  return Status::OK();
}

Status unpack(Client& c, const std::string& path, const std::string& dst) {
  ASSIGN_OR_RETURN(auto r, pack::PackReader::open(c, path));
  std::vector<uint8_t> buf;
  uint64_t bytes = 0;
  const auto t0 = Clock::now();
  for (uint64_t i = 0; i < r->size(); ++i) {
    ASSIGN_OR_RETURN(pack::Entry e, r->entry(i));
    ASSIGN_OR_RETURN(std::string name, r->name(e));
    const fs::path out = fs::path(dst) / name;
    if (name.find("..") != std::string::npos || fs::path(name).is_absolute()) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("sample name {:?} would leave {}", name, dst));
    }
    buf.resize(e.length);
    RETURN_ON_ERROR(r->read(e, buf));
    std::error_code ec;
    fs::create_directories(out.parent_path(), ec);
    std::ofstream f(out, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    if (!f) return Status(ErrorCode::kIOError, fmt::format("{}: write failed", out.string()));
    f.close();
    if (e.mtime_ns != 0) {
      struct timespec times[2] = {{0, UTIME_OMIT},
                                  {e.mtime_ns / 1000000000, e.mtime_ns % 1000000000}};
      (void)::utimensat(AT_FDCWD, out.c_str(), times, 0);
    }
    bytes += e.length;
  }
  progress(r->size(), r->size(), bytes, t0, true);
  return Status::OK();
}

}  // namespace

void addPackCommands(CLI::App& app) {
  {
    auto* cmd = app.add_subcommand(
        "pack", "pack a local directory tree into the cluster (many samples, few files)");
    auto& flags = addClusterFlags(cmd);
    static std::vector<std::string> args;
    static bool list = false, verify = false, append = false;
    static uint64_t shard_mib = 256;
    static int threads = 4;
    cmd->add_option("args", args,
                    "SRC DST (a local directory, the pack's path in the cluster); "
                    "with --list or --verify: PACK")
        ->required();
    cmd->add_flag("--list", list, "list the samples of PACK (size, name)");
    cmd->add_flag("--verify", verify, "read every sample of PACK and check every checksum");
    cmd->add_flag("--append", append,
                  "add SRC's files to the pack at DST (a new index generation)");
    cmd->add_option("--shard-mib", shard_mib, "shard size (MiB)")->capture_default_str();
    cmd->add_option("--threads", threads, "files read at once")->capture_default_str();
    cmd->callback([&flags] {
      auto c = connectOrReport(flags);
      if (!c) return;
      if (list || verify) {
        if (args.size() != 1) {
          fmt::print(stderr, "cistern pack --list/--verify: one PACK expected\n");
          setExitCode(2);
          return;
        }
        const std::string p = remotePath(args[0]);
        if (list) {
          reportStatus(listPack(*c, p), p);
          return;
        }
        auto r = pack::PackReader::open(*c, p);
        if (reportStatus(r.status(), p)) return;
        if (reportStatus((*r)->verify(), p)) return;
        fmt::print("{}: ok, {} samples in {} shards\n", p, (*r)->size(), (*r)->header().shards);
        return;
      }
      if (args.size() != 2) {
        fmt::print(stderr, "cistern pack: SRC DST expected\n");
        setExitCode(2);
        return;
      }
      if (shard_mib == 0 || threads < 1) {
        fmt::print(stderr, "cistern pack: --shard-mib and --threads must be positive\n");
        setExitCode(2);
        return;
      }
      reportStatus(packTree(*c, args[0], remotePath(args[1]), append, shard_mib << 20, threads),
                   "pack " + args[0]);
    });
  }
  {
    auto* cmd = app.add_subcommand("unpack", "a pack back into a local directory tree");
    auto& flags = addClusterFlags(cmd);
    static std::string pack_path, dst;
    cmd->add_option("PACK", pack_path, "the pack's path in the cluster")->required();
    cmd->add_option("DST", dst, "a local directory")->required();
    cmd->callback([&flags] {
      auto c = connectOrReport(flags);
      if (!c) return;
      reportStatus(unpack(*c, remotePath(pack_path), dst), "unpack " + pack_path);
    });
  }
}

}  // namespace cistern::cli
