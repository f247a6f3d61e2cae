// put and get: copy files and trees between the local file system and the
// cluster, several files at once, with a progress line on a terminal.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "cli/commands.h"
#include "cli/remote.h"

namespace cistern::cli {
namespace {

constexpr size_t kBufferBytes = 4 << 20;

struct Job {
  std::string src, dst;
  uint64_t size = 0;
  uint32_t mode = 0644;
};

// "\r 1.2 GiB / 3.4 GiB  250.0 MiB/s  ETA 0:09" on stderr, when stdout is a terminal.
class Progress {
 public:
  explicit Progress(uint64_t total) : total_(total), start_(Clock::now()) {
    if (::isatty(1)) printer_ = std::thread([this] { loop(); });
  }
  ~Progress() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (printer_.joinable()) {
      printer_.join();
      print();
      fmt::print(stderr, "\n");
    }
  }
  void add(uint64_t n) { done_.fetch_add(n, std::memory_order_relaxed); }

 private:
  using Clock = std::chrono::steady_clock;
  void loop() {
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(250), [this] { return stop_; })) print();
  }
  void print() {
    double secs = std::chrono::duration<double>(Clock::now() - start_).count();
    uint64_t done = done_.load();
    double rate = secs > 0 ? static_cast<double>(done) / secs : 0;
    std::string eta = "-:--";
    if (rate > 0 && total_ >= done) {
      auto left = static_cast<uint64_t>(static_cast<double>(total_ - done) / rate);
      eta = fmt::format("{}:{:02}", left / 60, left % 60);
    }
    fmt::print(stderr, "\r {} / {}  {}/s  ETA {}   ", humanBytes(static_cast<double>(done)),
               humanBytes(static_cast<double>(total_)), humanBytes(rate), eta);
  }
  const uint64_t total_;
  const Clock::time_point start_;
  std::atomic<uint64_t> done_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread printer_;
};

std::string join(const std::string& dir, const std::string& name) {
  if (!dir.empty() && dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

std::string baseName(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  auto slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

Error localError(const std::string& path, int err) {
  return Error{err, fmt::format("{}: {}", path, std::strerror(err))};
}

// Runs jobs on `threads` threads; each job reports its own errors.
template <typename Fn>
void runJobs(std::vector<Job>& jobs, uint32_t threads, Fn fn) {
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (uint32_t t = 0; t < std::max<uint32_t>(1, threads); ++t) {
    pool.emplace_back([&] {
      std::vector<uint8_t> buf(kBufferBytes);
      for (size_t i; (i = next.fetch_add(1)) < jobs.size();) fn(jobs[i], buf);
    });
  }
  for (auto& t : pool) t.join();
}

std::mutex g_report_mu;
void reportLocked(const Error& e) {
  std::lock_guard lock(g_report_mu);
  report(e);
}

void putFile(Client& c, const Job& job, std::vector<uint8_t>& buf, Progress& progress) {
  int fd = ::open(job.src.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return reportLocked(localError(job.src, errno));
  std::unique_ptr<File> f;
  Error e = c.open(job.dst, O_WRONLY | O_CREAT | O_TRUNC, job.mode, &f);
  for (uint64_t off = 0; !e;) {
    ssize_t n = ::pread(fd, buf.data(), buf.size(), static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      e = localError(job.src, errno);
      break;
    }
    if (n == 0) break;
    size_t done = 0;
    e = f->pwrite(buf.data(), static_cast<size_t>(n), off, &done);
    off += static_cast<uint64_t>(n);
    progress.add(static_cast<uint64_t>(n));
  }
  ::close(fd);
  if (f) {
    Error closed = f->close();
    if (!e) e = closed;
  }
  if (e) reportLocked(e);
}

void getFile(Client& c, const Job& job, std::vector<uint8_t>& buf, Progress& progress) {
  std::unique_ptr<File> f;
  Error e = c.open(job.src, O_RDONLY, 0, &f);
  if (e) return reportLocked(e);
  int fd = ::open(job.dst.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, job.mode);
  if (fd < 0) e = localError(job.dst, errno);
  for (uint64_t off = 0; !e;) {
    size_t got = 0;
    e = f->pread(buf.data(), buf.size(), off, &got);
    if (e || got == 0) break;
    for (size_t w = 0; w < got;) {
      ssize_t n = ::pwrite(fd, buf.data() + w, got - w, static_cast<off_t>(off + w));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        e = localError(job.dst, errno);
        break;
      }
      w += static_cast<size_t>(n);
    }
    off += got;
    progress.add(got);
  }
  if (fd >= 0 && ::close(fd) != 0 && !e) e = localError(job.dst, errno);
  Error closed = f->close();
  if (!e) e = closed;
  if (e) reportLocked(e);
}

void put(Client& c, const std::string& local, const std::string& remote, uint32_t threads) {
  struct stat st;
  if (::stat(local.c_str(), &st) != 0) return (void)report(localError(local, errno));
  FileInfo dst_info;
  bool dst_is_dir = !c.stat(remote, &dst_info) && dst_info.isDir();
  std::string root = dst_is_dir ? join(remote, baseName(local)) : remote;
  std::vector<Job> jobs;
  uint64_t total = 0;
  if (S_ISDIR(st.st_mode)) {
    if (report(c.mkdir(root, st.st_mode & 07777, true))) return;
    std::error_code ec;
    std::filesystem::recursive_directory_iterator it(local, ec), end;
    if (ec) return (void)report(localError(local, ec.value()));
    for (; it != end; it.increment(ec)) {
      if (ec) {
        report(localError(local, ec.value()));
        break;
      }
      std::string rel = std::filesystem::relative(it->path(), local).string();
      std::string dst = join(root, rel);
      struct stat s;
      if (::stat(it->path().c_str(), &s) != 0) {
        report(localError(it->path().string(), errno));
        continue;
      }
      if (S_ISDIR(s.st_mode)) {
        if (report(c.mkdir(dst, s.st_mode & 07777, true))) it.disable_recursion_pending();
      } else if (S_ISREG(s.st_mode)) {
        jobs.push_back(
            {it->path().string(), dst, static_cast<uint64_t>(s.st_size), s.st_mode & 07777});
        total += static_cast<uint64_t>(s.st_size);
      } else {
        fmt::print(stderr, "cistern: {}: skipped (not a regular file or directory)\n",
                   it->path().string());
      }
    }
  } else if (S_ISREG(st.st_mode)) {
    jobs.push_back({local, root, static_cast<uint64_t>(st.st_size), st.st_mode & 07777});
    total = static_cast<uint64_t>(st.st_size);
  } else {
    return (void)report(Error{EINVAL, local + ": not a regular file or directory"});
  }
  Progress progress(total);
  runJobs(jobs, threads, [&](Job& j, std::vector<uint8_t>& buf) { putFile(c, j, buf, progress); });
}

// Collects the files below remote directory `dir` into jobs, making the local directories.
void walkRemote(Client& c, const std::string& dir, const std::string& local_dir,
                std::vector<Job>* jobs, uint64_t* total) {
  std::vector<DirEntry> entries;
  if (report(c.list(dir, &entries))) return;
  for (const auto& d : entries) {
    std::string src = join(dir, d.name), dst = join(local_dir, d.name);
    if (d.info.isDir()) {
      if (::mkdir(dst.c_str(), d.info.mode & 07777) != 0 && errno != EEXIST) {
        report(localError(dst, errno));
        continue;
      }
      walkRemote(c, src, dst, jobs, total);
    } else if (d.info.isRegular()) {
      jobs->push_back({src, dst, d.info.size, d.info.mode & 07777});
      *total += d.info.size;
    }
  }
}

void get(Client& c, const std::string& remote, const std::string& local, uint32_t threads) {
  FileInfo info;
  if (report(c.stat(remote, &info))) return;
  struct stat st;
  bool local_is_dir = ::stat(local.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  std::string root = local_is_dir ? join(local, baseName(remote)) : local;
  std::vector<Job> jobs;
  uint64_t total = 0;
  if (info.isDir()) {
    if (::mkdir(root.c_str(), info.mode & 07777) != 0 && errno != EEXIST)
      return (void)report(localError(root, errno));
    walkRemote(c, remote, root, &jobs, &total);
  } else if (info.isRegular()) {
    jobs.push_back({remote, root, info.size, info.mode & 07777});
    total = info.size;
  } else {
    return (void)report(Error{EINVAL, remote + ": not a regular file or directory"});
  }
  Progress progress(total);
  runJobs(jobs, threads, [&](Job& j, std::vector<uint8_t>& buf) { getFile(c, j, buf, progress); });
}

}  // namespace

void addCopyCommands(CLI::App& app) {
  {
    auto* cmd = app.add_subcommand("put", "copy a local file or directory tree into the cluster");
    auto& flags = addClusterFlags(cmd);
    static std::string local, remote;
    static uint32_t threads = 4;
    cmd->add_option("local", local, "local file or directory")->required();
    cmd->add_option("remote", remote, "remote path; into it when it is a directory")->required();
    cmd->add_option("-j,--jobs", threads, "files copied at once")->capture_default_str();
    cmd->callback([&flags] {
      auto c = connectOrReport(flags);
      if (c) put(*c, local, remotePath(remote), threads);
    });
  }
  {
    auto* cmd =
        app.add_subcommand("get", "copy a remote file or directory tree out of the cluster");
    auto& flags = addClusterFlags(cmd);
    static std::string remote, local;
    static uint32_t threads = 4;
    cmd->add_option("remote", remote, "remote file or directory")->required();
    cmd->add_option("local", local, "local path; into it when it is a directory")->required();
    cmd->add_option("-j,--jobs", threads, "files copied at once")->capture_default_str();
    cmd->callback([&flags] {
      auto c = connectOrReport(flags);
      if (c) get(*c, remotePath(remote), local, threads);
    });
  }
}

}  // namespace cistern::cli
