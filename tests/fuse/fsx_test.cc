// An fsx-style checker for the FUSE mount: random writes, reads, truncates,
// mmap reads, fsyncs, reopens and page-cache drops on one file, every read
// compared against an in-memory model of the file.
//
//   CISTERN_FSX_OPS   number of operations (default 100000)
//   CISTERN_FSX_SEED  seed to replay a failure (default: from the clock)
//
// The seed is printed at the start and with every failure, together with the
// last operations, so a failing run replays exactly.
#include <sys/mman.h>

#include <cinttypes>
#include <cstdarg>
#include <deque>
#include <random>
#include <vector>

#include "tests/fuse/mount_env.h"

namespace cistern::testing {
namespace {

constexpr uint64_t kMaxLen = 6 << 20;  // spans several 1 MiB chunks

uint64_t envOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

class Fsx {
 public:
  Fsx(std::string path, uint64_t seed) : path_(std::move(path)), seed_(seed), rng_(seed) {}

  // Runs `ops` operations; returns false (with a gtest failure) at the first mismatch.
  bool run(uint64_t ops) {
    fd_ = ::open(path_.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0644);
    fd2_ = ::open(path_.c_str(), O_RDWR);
    if (fd_ < 0 || fd2_ < 0) return fail("open", std::strerror(errno));
    for (op_ = 1; op_ <= ops; ++op_) {
      uint32_t pick = rng_() % 100;
      bool ok = pick < 35   ? doWrite()
                : pick < 70 ? doRead()
                : pick < 80 ? doTruncate()
                : pick < 88 ? doMmapRead()
                : pick < 92 ? doFsync()
                : pick < 96 ? doDropCache()
                            : doReopen();
      if (!ok) return false;
    }
    ::close(fd_);
    ::close(fd2_);
    // After closing, the file as a new opener sees it.
    fd_ = ::open(path_.c_str(), O_RDONLY);
    bool ok = fullCompare("final");
    ::close(fd_);
    return ok;
  }

 private:
  uint64_t len() {
    // Mostly small, sometimes up to a chunk.
    uint32_t p = rng_() % 100;
    if (p < 70) return 1 + rng_() % 4096;
    if (p < 98) return 1 + rng_() % 65536;
    return 1 + rng_() % (1 << 20);
  }
  int anyFd() { return rng_() % 2 ? fd_ : fd2_; }

  void note(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    char buf[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    log_.push_back(std::to_string(op_) + ": " + buf);
    if (log_.size() > 30) log_.pop_front();
  }

  bool fail(const std::string& what, const std::string& detail) {
    std::string history;
    for (const auto& l : log_) history += "  " + l + "\n";
    ADD_FAILURE() << "fsx: " << what << " failed at op " << op_ << ": " << detail
                  << "\n  replay with CISTERN_FSX_SEED=" << seed_ << " (model size "
                  << model_.size() << ")\n  last operations:\n"
                  << history;
    return false;
  }

  bool doWrite() {
    uint64_t off = rng_() % kMaxLen, n = std::min(len(), kMaxLen - off);
    std::string data(n, '\0');
    for (auto& c : data) c = static_cast<char>(rng_() | 1);
    int fd = anyFd();
    note("write fd%d off=%" PRIu64 " len=%" PRIu64, fd == fd_ ? 1 : 2, off, n);
    ssize_t w = ::pwrite(fd, data.data(), n, static_cast<off_t>(off));
    if (w != static_cast<ssize_t>(n))
      return fail("pwrite", w < 0 ? std::strerror(errno) : "short write " + std::to_string(w));
    if (model_.size() < off + n) model_.resize(off + n, '\0');
    model_.replace(off, n, data);
    return true;
  }

  bool compareAt(int fd, uint64_t off, uint64_t n, const char* what) {
    n = std::min<uint64_t>(n, 2 * kMaxLen);
    std::vector<char> buf(n + 1);
    ssize_t r = ::pread(fd, buf.data(), n, static_cast<off_t>(off));
    if (r < 0) return fail(what, std::strerror(errno));
    uint64_t want = off >= model_.size() ? 0 : std::min<uint64_t>(n, model_.size() - off);
    if (static_cast<uint64_t>(r) != want)
      return fail(what, "read " + std::to_string(r) + " bytes at " + std::to_string(off) +
                            ", model has " + std::to_string(want));
    for (uint64_t i = 0; i < want; ++i) {
      if (buf[i] != model_[off + i]) {
        char msg[160];
        snprintf(msg, sizeof msg, "byte %" PRIu64 " is 0x%02x, model 0x%02x", off + i,
                 static_cast<uint8_t>(buf[i]), static_cast<uint8_t>(model_[off + i]));
        return fail(what, msg);
      }
    }
    return true;
  }

  bool doRead() {
    uint64_t off = rng_() % (model_.size() + 4096), n = len();
    int fd = anyFd();
    note("read fd%d off=%" PRIu64 " len=%" PRIu64, fd == fd_ ? 1 : 2, off, n);
    return compareAt(fd, off, n, "pread");
  }

  bool doTruncate() {
    uint64_t size = rng_() % 2 ? rng_() % kMaxLen : rng_() % (model_.size() + 1);
    note("truncate %" PRIu64 " (was %zu)", size, model_.size());
    if (::ftruncate(anyFd(), static_cast<off_t>(size)) != 0)
      return fail("ftruncate", std::strerror(errno));
    model_.resize(size, '\0');
    return true;
  }

  bool doMmapRead() {
    if (model_.empty()) return true;
    const uint64_t page = 4096;
    uint64_t off = (rng_() % model_.size()) / page * page;
    uint64_t n = std::min<uint64_t>(len(), model_.size() - off);
    note("mmap read off=%" PRIu64 " len=%" PRIu64, off, n);
    void* p = ::mmap(nullptr, n, PROT_READ, MAP_SHARED, fd_, static_cast<off_t>(off));
    if (p == MAP_FAILED) return fail("mmap", std::strerror(errno));
    bool same = std::memcmp(p, model_.data() + off, n) == 0;
    uint64_t bad = 0;
    if (!same)
      while (static_cast<char*>(p)[bad] == model_[off + bad]) ++bad;
    ::munmap(p, n);
    if (!same) return fail("mmap read", "first difference at byte " + std::to_string(off + bad));
    return true;
  }

  bool doFsync() {
    note("fsync");
    if (::fsync(anyFd()) != 0) return fail("fsync", std::strerror(errno));
    return true;
  }

  bool doDropCache() {
    note("drop page cache");
    // Clean pages go; the next reads come from the mount.
    if (::fsync(fd_) != 0) return fail("fsync", std::strerror(errno));
    posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
    return true;
  }

  bool doReopen() {
    note("close and reopen fd1");
    if (::close(fd_) != 0) return fail("close", std::strerror(errno));
    fd_ = ::open(path_.c_str(), O_RDWR);
    if (fd_ < 0) return fail("reopen", std::strerror(errno));
    return fullCompare("after reopen");
  }

  bool fullCompare(const char* what) {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return fail(what, std::strerror(errno));
    if (static_cast<uint64_t>(st.st_size) != model_.size())
      return fail(
          what, "size " + std::to_string(st.st_size) + ", model " + std::to_string(model_.size()));
    return compareAt(fd_, 0, model_.size() + 1, what);
  }

  std::string path_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  std::string model_;
  int fd_ = -1, fd2_ = -1;
  uint64_t op_ = 0;
  std::deque<std::string> log_;
};

TEST(Fsx, RandomOperationsMatchTheModel) {
  uint64_t seed = envOr("CISTERN_FSX_SEED", static_cast<uint64_t>(time(nullptr)));
  uint64_t ops = envOr("CISTERN_FSX_OPS", 100000);
  std::printf("fsx: %" PRIu64 " operations, CISTERN_FSX_SEED=%" PRIu64 "\n", ops, seed);
  std::string dir = testDir();
  Fsx fsx(dir + "/fsx.data", seed);
  EXPECT_TRUE(fsx.run(ops));
}

}  // namespace
}  // namespace cistern::testing

CISTERN_FUSE_TEST_MAIN()
