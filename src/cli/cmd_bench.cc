// `cistern bench`: the same workloads through libcistern and, with
// --baseline DIR, on a local directory in the same run, with the ratios.
//
//   seqwrite   T threads each write one file of size/T in --block writes, then close
//              (the local files are fsync'ed before close: cistern's chunk writes are durable)
//   seqread    the same files read back in --block reads (local: page cache dropped first)
//   randread   4 KiB reads at random aligned offsets of those files for --seconds, T threads
//   smallfile  --files files of --file-size bytes: create+write+close, open+read+close, unlink
//   stat       stat of every small file
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <random>
#include <thread>

#include "cli/commands.h"
#include "cli/remote.h"
#include "common/metrics.h"

namespace cistern::cli {
namespace {

using Clock = std::chrono::steady_clock;

// A place the workloads run: the cluster or a local directory.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual bool mkdir(const std::string& p) = 0;
  // Writes `size` bytes in `block` writes from `buf`.
  virtual bool writeFile(const std::string& p, uint64_t size, size_t block, const uint8_t* buf) = 0;
  virtual bool readFile(const std::string& p, size_t block, uint8_t* buf, uint64_t* got) = 0;
  // 4 KiB reads at random offsets until `stop`; returns the count.
  virtual uint64_t randomReads(const std::string& p, uint64_t size, const std::atomic<bool>& stop,
                               uint64_t seed) = 0;
  virtual bool stat(const std::string& p) = 0;
  virtual bool unlink(const std::string& p) = 0;
  virtual void dropCache(const std::string&) {}
};

class ClusterBackend final : public Backend {
 public:
  explicit ClusterBackend(Client& c) : c_(c) {}
  std::string name() const override { return "cistern"; }
  bool mkdir(const std::string& p) override { return !report(c_.mkdir(p, 0755, true)); }
  bool writeFile(const std::string& p, uint64_t size, size_t block, const uint8_t* buf) override {
    std::unique_ptr<File> f;
    if (report(c_.open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644, &f))) return false;
    for (uint64_t off = 0; off < size; off += block) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(block, size - off)), done = 0;
      if (report(f->pwrite(buf, n, off, &done))) return false;
    }
    return !report(f->close());
  }
  bool readFile(const std::string& p, size_t block, uint8_t* buf, uint64_t* got) override {
    std::unique_ptr<File> f;
    if (report(c_.open(p, O_RDONLY, 0, &f))) return false;
    for (uint64_t off = 0;;) {
      size_t n = 0;
      if (report(f->pread(buf, block, off, &n))) return false;
      if (n == 0) break;
      off += n;
      *got += n;
    }
    return !report(f->close());
  }
  uint64_t randomReads(const std::string& p, uint64_t size, const std::atomic<bool>& stop,
                       uint64_t seed) override {
    std::unique_ptr<File> f;
    if (report(c_.open(p, O_RDONLY, 0, &f))) return 0;
    std::mt19937_64 rng(seed);
    uint8_t buf[4096];
    uint64_t count = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      size_t n = 0;
      if (report(f->pread(buf, sizeof(buf), rng() % (size / 4096) * 4096, &n))) break;
      ++count;
    }
    (void)f->close();
    return count;
  }
  bool stat(const std::string& p) override {
    FileInfo i;
    return !report(c_.stat(p, &i));
  }
  bool unlink(const std::string& p) override { return !report(c_.unlink(p)); }

 private:
  Client& c_;
};

class LocalBackend final : public Backend {
 public:
  explicit LocalBackend(std::string root) : root_(std::move(root)) {}
  std::string name() const override { return "local"; }
  bool mkdir(const std::string& p) override {
    std::error_code ec;
    std::filesystem::create_directories(root_ + p, ec);
    return !fail(p, ec.value());
  }
  bool writeFile(const std::string& p, uint64_t size, size_t block, const uint8_t* buf) override {
    int fd = ::open((root_ + p).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return !fail(p, errno);
    for (uint64_t off = 0; off < size; off += block) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(block, size - off));
      if (::pwrite(fd, buf, n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) {
        ::close(fd);
        return !fail(p, errno);
      }
    }
    bool ok = ::fsync(fd) == 0;
    ::close(fd);
    return ok || !fail(p, errno);
  }
  bool readFile(const std::string& p, size_t block, uint8_t* buf, uint64_t* got) override {
    int fd = ::open((root_ + p).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return !fail(p, errno);
    for (;;) {
      ssize_t n = ::read(fd, buf, block);
      if (n < 0) {
        ::close(fd);
        return !fail(p, errno);
      }
      if (n == 0) break;
      *got += static_cast<uint64_t>(n);
    }
    ::close(fd);
    return true;
  }
  uint64_t randomReads(const std::string& p, uint64_t size, const std::atomic<bool>& stop,
                       uint64_t seed) override {
    int fd = ::open((root_ + p).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(p, errno), 0;
    std::mt19937_64 rng(seed);
    uint8_t buf[4096];
    uint64_t count = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      if (::pread(fd, buf, sizeof(buf), static_cast<off_t>(rng() % (size / 4096) * 4096)) < 0)
        break;
      ++count;
    }
    ::close(fd);
    return count;
  }
  bool stat(const std::string& p) override {
    struct stat st;
    return ::stat((root_ + p).c_str(), &st) == 0 || !fail(p, errno);
  }
  bool unlink(const std::string& p) override {
    return ::unlink((root_ + p).c_str()) == 0 || !fail(p, errno);
  }
  void dropCache(const std::string& p) override {
    int fd = ::open((root_ + p).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }

 private:
  bool fail(const std::string& p, int err) {
    if (err == 0) return false;
    report(Error{err, fmt::format("{}{}: {}", root_, p, std::strerror(err))});
    return true;
  }
  std::string root_;
};

struct BenchOptions {
  double gib = 1;
  uint32_t threads = 4;
  size_t block = 1 << 20;
  uint32_t files = 2000;
  uint32_t file_size = 4096;
  double seconds = 5;
};

struct Figures {
  double seqwrite = 0, seqread = 0, randread = 0, create = 0, read = 0, stat = 0, remove = 0;
};

double timed(uint32_t threads, const std::function<bool(uint32_t)>& fn, bool* ok) {
  std::atomic<bool> good{true};
  auto start = Clock::now();
  std::vector<std::thread> pool;
  for (uint32_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      if (!fn(t)) good = false;
    });
  for (auto& th : pool) th.join();
  *ok = *ok && good;
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool runAll(Backend& b, const BenchOptions& o, Figures* f) {
  bool ok = b.mkdir("/cistern-bench") && b.mkdir("/cistern-bench/small");
  if (!ok) return false;
  uint64_t per_thread = static_cast<uint64_t>(o.gib * (1ull << 30)) / o.threads / o.block * o.block;
  if (per_thread == 0) per_thread = o.block;
  std::vector<uint8_t> data(o.block);
  std::mt19937_64 rng(42);
  for (auto& x : data) x = static_cast<uint8_t>(rng());
  auto big = [](uint32_t t) { return fmt::format("/cistern-bench/seq-{}", t); };
  double secs = timed(
      o.threads, [&](uint32_t t) { return b.writeFile(big(t), per_thread, o.block, data.data()); },
      &ok);
  f->seqwrite = static_cast<double>(per_thread * o.threads) / secs / 1e6;
  for (uint32_t t = 0; t < o.threads; ++t) b.dropCache(big(t));
  std::atomic<uint64_t> total{0};
  secs = timed(
      o.threads,
      [&](uint32_t t) {
        std::vector<uint8_t> buf(o.block);
        uint64_t got = 0;
        bool r = b.readFile(big(t), o.block, buf.data(), &got);
        total += got;
        return r;
      },
      &ok);
  if (total != per_thread * o.threads) {
    report(Error{EIO, fmt::format("{}: read {} bytes back, wrote {}", b.name(), total.load(),
                                  per_thread * o.threads)});
    return false;
  }
  f->seqread = static_cast<double>(total) / secs / 1e6;
  for (uint32_t t = 0; t < o.threads; ++t) b.dropCache(big(t));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0};
  std::thread timer([&] {
    std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
    stop = true;
  });
  secs = timed(
      o.threads * 4,
      [&](uint32_t t) {
        reads += b.randomReads(big(t % o.threads), per_thread, stop, t);
        return true;
      },
      &ok);
  timer.join();
  f->randread = static_cast<double>(reads) / secs;
  for (uint32_t t = 0; t < o.threads; ++t) ok = b.unlink(big(t)) && ok;
  auto small = [](uint32_t i) { return fmt::format("/cistern-bench/small/f{:07}", i); };
  std::vector<uint8_t> sbuf(std::max<size_t>(o.file_size, 1));
  auto each = [&](const std::function<bool(uint32_t)>& fn) {
    double s = timed(
        o.threads,
        [&](uint32_t t) {
          for (uint32_t i = t; i < o.files; i += o.threads)
            if (!fn(i)) return false;
          return true;
        },
        &ok);
    return o.files / s;
  };
  f->create = each(
      [&](uint32_t i) { return b.writeFile(small(i), o.file_size, o.file_size, data.data()); });
  for (uint32_t i = 0; i < o.files; ++i) b.dropCache(small(i));
  f->read = each([&](uint32_t i) {
    uint64_t got = 0;
    return b.readFile(small(i), sbuf.size(), sbuf.data(), &got) && got == o.file_size;
  });
  f->stat = each([&](uint32_t i) { return b.stat(small(i)); });
  f->remove = each([&](uint32_t i) { return b.unlink(small(i)); });
  return ok;
}

void print(const char* name, const Figures& f) {
  fmt::print(
      "{:<8} seqwrite {:8.1f} MB/s  seqread {:8.1f} MB/s  randread {:8.0f}/s  "
      "create {:7.0f}/s  read {:7.0f}/s  stat {:7.0f}/s  unlink {:7.0f}/s\n",
      name, f.seqwrite, f.seqread, f.randread, f.create, f.read, f.stat, f.remove);
}

}  // namespace

void addBench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "benchmark the cluster (and a local directory)");
  auto& flags = addClusterFlags(cmd);
  static BenchOptions o;
  static std::string baseline;
  static uint32_t rounds = 1;
  cmd->add_option("--gib", o.gib, "GiB written and read sequentially")->capture_default_str();
  cmd->add_option("-t,--threads", o.threads, "threads")->capture_default_str();
  cmd->add_option("--block", o.block, "bytes per sequential read/write")->capture_default_str();
  cmd->add_option("--files", o.files, "small files")->capture_default_str();
  cmd->add_option("--file-size", o.file_size, "bytes per small file")->capture_default_str();
  cmd->add_option("--seconds", o.seconds, "random-read duration")->capture_default_str();
  cmd->add_option("--baseline", baseline, "local directory to run the same workloads on");
  cmd->add_option("--rounds", rounds, "alternating rounds; medians are reported")
      ->capture_default_str();
  cmd->callback([&flags] {
    if (o.threads == 0 || o.block == 0 || o.files == 0 || rounds == 0) {
      report(Error{EINVAL, "bench: --threads, --block, --files and --rounds must be > 0"});
      return;
    }
    auto c = connectOrReport(flags);
    if (!c) return;
    ClusterBackend cluster(*c);
    std::unique_ptr<LocalBackend> local;
    if (!baseline.empty()) local = std::make_unique<LocalBackend>(baseline);
    std::vector<Figures> cf, lf;
    for (uint32_t r = 0; r < rounds; ++r) {
      Figures f;
      if (!runAll(cluster, o, &f)) return;
      print("cistern", f);
      cf.push_back(f);
      if (local) {
        Figures g;
        if (!runAll(*local, o, &g)) return;
        print("local", g);
        lf.push_back(g);
      }
    }
    auto med = [](const std::vector<Figures>& v, double Figures::*m) {
      std::vector<double> x;
      for (const auto& f : v) x.push_back(f.*m);
      return metrics::median(x);
    };
    // Each round's value (bench/run records them), then the medians.
    auto rounds = [](const char* name, const std::vector<double>& v) {
      std::string line = fmt::format("rounds {}:", name);
      for (size_t i = 0; i < v.size(); ++i) line += fmt::format("{} {:.3f}", i ? " /" : "", v[i]);
      fmt::print("{}\n", line);
    };
    auto perRound = [&](double Figures::*m, bool ratio) {
      std::vector<double> x;
      for (size_t i = 0; i < cf.size(); ++i) x.push_back(ratio ? cf[i].*m / lf[i].*m : cf[i].*m);
      return x;
    };
    if (local) {
      rounds("client_seqwrite_vs_local", perRound(&Figures::seqwrite, true));
      rounds("client_seqread_vs_local", perRound(&Figures::seqread, true));
      rounds("client_randread_vs_local", perRound(&Figures::randread, true));
    }
    rounds("client_smallfile_create_per_s", perRound(&Figures::create, false));
    rounds("client_smallfile_read_per_s", perRound(&Figures::read, false));
    rounds("client_stat_per_s", perRound(&Figures::stat, false));
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fmt::print("peak_rss client {} MiB\n", ru.ru_maxrss / 1024);
    if (local) {
      fmt::print("figure client_seqwrite_vs_local {:.2f} x\n",
                 med(cf, &Figures::seqwrite) / med(lf, &Figures::seqwrite));
      fmt::print("figure client_seqread_vs_local {:.2f} x\n",
                 med(cf, &Figures::seqread) / med(lf, &Figures::seqread));
      fmt::print("figure client_randread_vs_local {:.2f} x\n",
                 med(cf, &Figures::randread) / med(lf, &Figures::randread));
    }
    fmt::print("figure client_smallfile_create_per_s {:.0f} ops/s\n", med(cf, &Figures::create));
    fmt::print("figure client_smallfile_read_per_s {:.0f} ops/s\n", med(cf, &Figures::read));
    fmt::print("figure client_stat_per_s {:.0f} ops/s\n", med(cf, &Figures::stat));
  });
}

}  // namespace cistern::cli
