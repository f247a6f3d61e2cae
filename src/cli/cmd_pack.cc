// `cistern pack SRC DST`: a local directory tree, or tar files (WebDataset
// shards among them), into a pack in the cluster (docs/pack_format.md),
// read by several threads, progress on stderr;
// `cistern pack --list PACK`, `cistern pack --verify PACK`;
// `cistern unpack PACK DST`: a pack back into a local directory tree.
#include <archive.h>
#include <archive_entry.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
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

// Bytes read by the readers ahead of the writer, at most.
constexpr uint64_t kQueueBytes = 256ull << 20;

// Tells the reader threads to stop (they check `stop` under `mu`) and waits for them.
void stopReaders(std::mutex& mu, std::condition_variable& cv, bool& stop,
                 std::vector<std::thread>& readers) {
  {
    std::lock_guard lock(mu);
    stop = true;
    cv.notify_all();
  }
  for (auto& t : readers) t.join();
}

// The end of a pack: the first error of the readers or the writer, else
// the index written and the last progress line.
Status finishPack(const Status& read_error, const Status& write_error, pack::PackWriter& writer,
                  uint64_t files, uint64_t bytes, Clock::time_point t0) {
  RETURN_ON_ERROR(read_error);
  RETURN_ON_ERROR(write_error);
  RETURN_ON_ERROR(writer.finish());
  progress(files, files, bytes, t0, true);
  return Status::OK();
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
  ASSIGN_OR_RETURN(auto writer,
                   pack::PackWriter::create(c, dst, {.shard_bytes = shard_bytes}, append));
  // Readers fill slots in file order; the writer takes them in that order.
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
  stopReaders(mu, cv, stop, readers);
  return finishPack(Status::OK(), result, *writer, files.size(), bytes, t0);
}

// A tar member's name as a sample name: leading "./" and "/" dropped (tar
// writes "./a.jpg" for `tar -C dir .`; WebDataset keys then start at "a").
std::string memberName(std::string_view n) {
  for (;;) {
    if (n.starts_with("./")) {
      n.remove_prefix(2);
    } else if (n.starts_with("/")) {
      n.remove_prefix(1);
    } else {
      return std::string(n);
    }
  }
}

// Reads the regular members of one tar file (any compression libarchive
// knows) and hands each to `put`, in archive order. Other members
// (directories, links) are skipped: WebDataset does the same.
template <typename Put>
Status readTar(const std::string& path, Put&& put) {
  struct archive* a = archive_read_new();
  archive_read_support_filter_all(a);
  archive_read_support_format_tar(a);
  archive_read_support_format_gnutar(a);
  auto fail = [&](std::string_view what) {
    Status s(ErrorCode::kIOError,
             fmt::format("{}: {}: {}", path, what,
                         archive_error_string(a) ? archive_error_string(a) : "unknown error"));
    archive_read_free(a);
    return s;
  };
  if (archive_read_open_filename(a, path.c_str(), 1 << 20) != ARCHIVE_OK) return fail("open");
  for (;;) {
    struct archive_entry* e = nullptr;
    const int rc = archive_read_next_header(a, &e);
    if (rc == ARCHIVE_EOF) break;
    if (rc < ARCHIVE_WARN) return fail("not a readable tar");
    if (archive_entry_filetype(e) != AE_IFREG) continue;
    auto s = std::make_unique<Sample>();
    s->name = memberName(archive_entry_pathname(e) ? archive_entry_pathname(e) : "");
    const la_int64_t size = archive_entry_size(e);
    if (size < 0 || static_cast<uint64_t>(size) > UINT32_MAX) {
      archive_read_free(a);
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("{}: member {:?} is {} bytes (a sample holds at most 4 GiB)", path,
                                s->name, size));
    }
    s->bytes.resize(static_cast<size_t>(size));
    size_t at = 0;
    while (at < s->bytes.size()) {
      const la_ssize_t n = archive_read_data(a, s->bytes.data() + at, s->bytes.size() - at);
      if (n < 0) return fail(fmt::format("member {:?}", s->name));
      if (n == 0) break;
      at += static_cast<size_t>(n);
    }
    if (at != s->bytes.size()) return fail(fmt::format("member {:?} cut short", s->name));
    if (archive_entry_mtime_is_set(e)) {
      s->mtime_ns = int64_t{archive_entry_mtime(e)} * 1000000000 + archive_entry_mtime_nsec(e);
    }
    if (s->name.empty()) continue;
    if (!put(std::move(s))) break;
  }
  archive_read_free(a);
  return Status::OK();
}

// Packs the regular members of `tars` (WebDataset shards or any tar files),
// `threads` tars read at once; at most kQueueBytes read ahead of the writer.
// Members keep their names, so a WebDataset sample's files (`key.jpg`,
// `key.cls`) sit next to each other in the index (docs/pack_format.md).
Status packTars(Client& c, const std::vector<std::string>& tars, const std::string& dst,
                bool append, uint64_t shard_bytes, int threads) {
  uint64_t tar_bytes = 0;
  for (const auto& t : tars) {
    std::error_code ec;
    const auto n = fs::file_size(t, ec);
    if (ec) return Status(ErrorCode::kNotFound, fmt::format("{}: {}", t, ec.message()));
    tar_bytes += n;
  }
  ASSIGN_OR_RETURN(auto writer,
                   pack::PackWriter::create(c, dst, {.shard_bytes = shard_bytes}, append));
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::unique_ptr<Sample>> queue;
  uint64_t queued = 0;
  const int spawn = std::min<int>(threads, static_cast<int>(tars.size()));
  int running = spawn;  // readers not yet done (under mu)
  bool stop = false;
  Status read_error;
  std::atomic<size_t> next{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < spawn; ++t) {
    readers.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < tars.size();) {
        Status s = readTar(tars[i], [&](std::unique_ptr<Sample> sample) {
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return stop || queued < kQueueBytes || queue.empty(); });
          if (stop) return false;
          queued += sample->bytes.size();
          queue.push_back(std::move(sample));
          cv.notify_all();
          return true;
        });
        if (!s.ok()) {
          std::lock_guard lock(mu);
          if (read_error.ok()) read_error = s;
          stop = true;
          cv.notify_all();
          break;
        }
      }
      std::lock_guard lock(mu);
      --running;
      cv.notify_all();
    });
  }
  Status result;
  uint64_t files = 0, bytes = 0;
  const auto t0 = Clock::now();
  auto last_print = t0;
  for (;;) {
    std::unique_ptr<Sample> s;
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return !queue.empty() || running == 0 || stop; });
      if (stop || queue.empty()) break;
      s = std::move(queue.front());
      queue.pop_front();
      queued -= s->bytes.size();
      cv.notify_all();
    }
    result = writer->add(s->name, s->bytes, s->mtime_ns);
    if (!result.ok()) break;
    ++files;
    bytes += s->bytes.size();
    if (Clock::now() - last_print > std::chrono::milliseconds(250)) {
      // The tars' bytes stand in for the count of members, unknown ahead.
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      const double left = bytes < tar_bytes ? static_cast<double>(tar_bytes - bytes) : 0;
      const auto eta =
          static_cast<uint64_t>(bytes > 0 ? secs * left / static_cast<double>(bytes) : 0);
      fmt::print(stderr, "\r{} files  {} of {}  {:.0f} MB/s  ETA {}:{:02}   ", files,
                 humanBytes(static_cast<double>(bytes)), humanBytes(static_cast<double>(tar_bytes)),
                 secs > 0 ? static_cast<double>(bytes) / secs / 1e6 : 0.0, eta / 60, eta % 60);
      last_print = Clock::now();
    }
  }
  stopReaders(mu, cv, stop, readers);
  return finishPack(read_error, result, *writer, files, bytes, t0);
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
        "pack",
        "pack a local directory tree or tar files (WebDataset shards) into the cluster "
        "(many samples, few files)");
    auto& flags = addClusterFlags(cmd);
    static std::vector<std::string> args;
    static bool list = false, verify = false, append = false;
    static uint64_t shard_mib = 256;
    static int threads = 4;
    cmd->add_option("args", args,
                    "SRC... DST (a local directory, or one or more tar files; the pack's path "
                    "in the cluster); "
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
      if (args.size() < 2) {
        fmt::print(stderr, "cistern pack: SRC... DST expected\n");
        setExitCode(2);
        return;
      }
      if (shard_mib == 0 || threads < 1) {
        fmt::print(stderr, "cistern pack: --shard-mib and --threads must be positive\n");
        setExitCode(2);
        return;
      }
      const std::string dst = remotePath(args.back());
      std::vector<std::string> srcs(args.begin(), args.end() - 1);
      std::error_code ec;
      if (srcs.size() == 1 && fs::is_directory(srcs[0], ec)) {
        reportStatus(packTree(*c, srcs[0], dst, append, shard_mib << 20, threads),
                     "pack " + srcs[0]);
        return;
      }
      for (const auto& s : srcs) {
        if (!fs::is_regular_file(s, ec)) {
          fmt::print(stderr, "cistern pack: {}: not a directory or a tar file\n", s);
          setExitCode(2);
          return;
        }
      }
      reportStatus(packTars(*c, srcs, dst, append, shard_mib << 20, threads),
                   fmt::format("pack {}", srcs.size() == 1 ? srcs[0] : srcs[0] + " ..."));
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
