#include "storage/io_backend.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/metrics.h"

namespace cistern::storage {
namespace {

Status ioError(int err, const IoRequest& r) {
  ErrorCode code = err == ENOSPC ? ErrorCode::kNoSpace : ErrorCode::kIOError;
  return Status(code, fmt::format("{} of {} bytes at {}: {}", r.is_write ? "write" : "read",
                                  r.length(), r.pos, std::strerror(err)));
}

// Finishes request `r` from byte `done` on with plain pread/pwrite. A
// direct (O_DIRECT) read comes back short only at the end of the file, which
// may lie inside a block (the last slot's CRC page is written buffered).
// Reading on from there is an unaligned direct read: 0 bytes while the file
// still ends there, but EINVAL once a write to a later slot has grown it
// meanwhile (seen in E2E.ConcurrentClientsOnFilesAndOnDisjointRangesOfOneFile
// under ASan). So the rest reads as zeros, as the file was when read.
Status finish(const IoRequest& r, size_t done) {
  if (!r.is_write && done > 0 && done < r.length()) {
    int flags = ::fcntl(r.fd, F_GETFL);
    if (flags >= 0 && (flags & O_DIRECT) != 0) {
      zeroFrom(r, done);
      return Status::OK();
    }
  }
  uint64_t pos = r.pos;
  for (int i = 0; i < r.iovcnt; ++i) {
    auto* base = static_cast<uint8_t*>(r.iov[i].iov_base);
    size_t len = r.iov[i].iov_len;
    size_t at = std::min(done, len);
    done -= at;
    while (at < len) {
      ssize_t n = r.is_write ? ::pwrite(r.fd, base + at, len - at, static_cast<off_t>(pos + at))
                             : ::pread(r.fd, base + at, len - at, static_cast<off_t>(pos + at));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ioError(errno, r);
      if (n == 0) {
        if (r.is_write) return ioError(EIO, r);
        std::memset(base + at, 0, len - at);  // past the end of the file
        break;
      }
      at += static_cast<size_t>(n);
    }
    pos += len;
  }
  return Status::OK();
}

class PsyncBackend : public IoBackend {
 public:
  Status run(std::span<IoRequest> requests) override {
    for (const IoRequest& r : requests) {
      if (r.iovcnt == 1) {
        RETURN_ON_ERROR(finish(r, 0));
        continue;
      }
      ssize_t n;
      do {
        n = r.is_write ? ::pwritev(r.fd, r.iov, r.iovcnt, static_cast<off_t>(r.pos))
                       : ::preadv(r.fd, r.iov, r.iovcnt, static_cast<off_t>(r.pos));
      } while (n < 0 && errno == EINTR);
      if (n < 0) return ioError(errno, r);
      if (static_cast<size_t>(n) < r.length()) RETURN_ON_ERROR(finish(r, static_cast<size_t>(n)));
    }
    return Status::OK();
  }
  std::string_view name() const override { return "psync"; }
};

// The status of request `q` whose transfer returned `res` (bytes or -errno):
// short transfers are completed and EINTR/EAGAIN redone with pread/pwrite.
Status settle(const IoRequest& q, int res) {
  if (res == -EINTR || res == -EAGAIN) return finish(q, 0);
  if (res < 0) return ioError(-res, q);
  if (static_cast<size_t>(res) < q.length()) return finish(q, static_cast<size_t>(res));
  return Status::OK();
}

// Small reads of every thread that uses a backend go through one ring, which
// one thread of its own fills, submits and reaps. A thread that blocks in
// its own ring for each 4 KiB read makes one submission, and one kick of the
// device, per read; here the reads that arrive while the ring's thread is
// busy go to the kernel together (bench/RESULTS.md, session 19: 32 threads
// of 4 KiB random reads, 58.9k against 47.2k IOPS). Only small reads come here:
// a read served from the page cache is copied by the thread that submits
// it, which must not be one thread for everyone's large reads.
// The ring is SINGLE_ISSUER | DEFER_TASKRUN: completions are processed when
// its thread asks for them, never by interrupting it or a caller.
class SharedReads {
 public:
  static constexpr size_t kRequestsMax = 8;
  static constexpr size_t kBytesMax = 64 << 10;

  // Null where the ring cannot be set up here (the caller then reads on
  // rings of its own threads).
  static std::unique_ptr<SharedReads> start() {
    std::unique_ptr<SharedReads> r(new SharedReads());
    r->efd_ = ::eventfd(0, EFD_CLOEXEC);  // blocking: the ring polls it (O_NONBLOCK would end each
                                          // read at once with EAGAIN)
    if (r->efd_ < 0) return nullptr;
    std::promise<int> ready;
    auto started = ready.get_future();
    r->thread_ = std::thread([p = r.get(), &ready] { p->loop(ready); });
    if (int err = started.get(); err != 0) {
      r->thread_.join();
      CLOG_WARN("storage", "shared read ring: {}; small reads use each thread's ring",
                std::strerror(err));
      return nullptr;
    }
    return r;
  }
  ~SharedReads() {
    if (thread_.joinable()) {
      stop_ = true;
      wake();
      thread_.join();
    }
    if (efd_ >= 0) ::close(efd_);
  }

  // Performs `requests` (reads, at most kRequestsMax) and returns when all
  // are done.
  Status run(std::span<IoRequest> requests) {
    static auto& reads = metrics::Registry::global().counter(
        "storage_io_shared_ring_reads_total", {},
        "Small reads performed through the backend's shared ring (one thread submits for all)");
    reads.inc(requests.size());
    Call call;
    Slot slots[kRequestsMax];
    call.left = static_cast<uint32_t>(requests.size());
    {
      std::lock_guard lock(mu_);
      for (size_t i = 0; i < requests.size(); ++i) {
        slots[i] = Slot{&call, &requests[i], 0};
        incoming_.push_back(&slots[i]);
      }
    }
    if (sleeping_.exchange(false)) wake();
    {
      std::unique_lock lock(call.mu);
      call.cv.wait(lock, [&] { return call.left == 0; });
    }
    Status first_error;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (first_error.ok()) first_error = settle(requests[i], slots[i].res);
    }
    return first_error;
  }

 private:
  // One run(): the caller sleeps until its requests are all done. (It
  // returns only after taking `mu`, which the ring's thread releases last.)
  struct Call {
    std::mutex mu;
    std::condition_variable cv;
    uint32_t left = 0;
  };
  struct Slot {
    Call* call;
    IoRequest* request;
    int res;
  };

  SharedReads() = default;

  void wake() {
    uint64_t one = 1;
    (void)!::write(efd_, &one, sizeof one);
  }

  // The eventfd's counter read through the ring: a CQE (with no slot) when
  // a caller wakes the thread.
  void armWake() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    io_uring_prep_read(sqe, efd_, &wake_count_, sizeof wake_count_, 0);
    io_uring_sqe_set_data(sqe, nullptr);
  }

  void loop(std::promise<int>& ready) {
    io_uring_params p{};
    p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
    if (int r = io_uring_queue_init_params(kEntries, &ring_, &p); r < 0) {
      ready.set_value(-r);
      return;
    }
    ready.set_value(0);
    armWake();
    std::vector<Slot*> waiting;  // taken from callers, not yet in the ring
    uint32_t in_flight = 0;
    for (;;) {
      {
        std::lock_guard lock(mu_);
        waiting.insert(waiting.end(), incoming_.begin(), incoming_.end());
        incoming_.clear();
      }
      size_t queued = 0;
      // One SQE stays free for re-arming the wake-up read.
      while (queued < waiting.size() && io_uring_sq_space_left(&ring_) > 1 &&
             in_flight + 1 < kEntries) {
        Slot* slot = waiting[queued++];
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        prepareUring(sqe, *slot->request);
        io_uring_sqe_set_data(sqe, slot);
        ++in_flight;
      }
      waiting.erase(waiting.begin(), waiting.begin() + static_cast<std::ptrdiff_t>(queued));
      if (stop_ && in_flight == 0 && waiting.empty()) break;
      // Sleep in the kernel only when no caller has queued meanwhile; one
      // that queues after this sees `sleeping_` and wakes the thread.
      sleeping_ = true;
      bool more;
      {
        std::lock_guard lock(mu_);
        more = !incoming_.empty();
      }
      int r;
      if (more) {
        sleeping_ = false;
        r = io_uring_submit_and_get_events(&ring_);
      } else {
        r = io_uring_submit_and_wait(&ring_, 1);
      }
      sleeping_ = false;
      CISTERN_CHECK(r >= 0 || r == -EINTR || r == -EAGAIN || r == -EBUSY,
                    "shared read ring: io_uring_enter failed");
      unsigned head, seen = 0;
      io_uring_cqe* cqe;
      bool rearm = false;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        auto* slot = static_cast<Slot*>(io_uring_cqe_get_data(cqe));
        if (!slot) {
          rearm = true;
          continue;
        }
        --in_flight;
        slot->res = cqe->res;
        Call* call = slot->call;
        std::lock_guard lock(call->mu);
        if (--call->left == 0) call->cv.notify_one();
      }
      io_uring_cq_advance(&ring_, seen);
      if (rearm) armWake();
    }
    io_uring_queue_exit(&ring_);
  }

  static constexpr unsigned kEntries = 256;
  io_uring ring_{};
  int efd_ = -1;
  uint64_t wake_count_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<Slot*> incoming_;  // guarded by mu_
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> stop_{false};
};

constexpr unsigned kRingEntries = 16;

struct Ring {
  io_uring ring;
  int init_error = 0;
  Ring() { init_error = -io_uring_queue_init(kRingEntries, &ring, 0); }
  ~Ring() {
    if (init_error == 0) io_uring_queue_exit(&ring);
  }
};

Ring& threadRing() {
  thread_local Ring r;
  return r;
}

class UringBackend : public IoBackend {
 public:
  UringBackend() : shared_(SharedReads::start()) {}

  Status run(std::span<IoRequest> requests) override {
    if (shared_ && requests.size() <= SharedReads::kRequestsMax) {
      bool small_reads = true;
      size_t bytes = 0;
      for (const IoRequest& q : requests) {
        small_reads = small_reads && !q.is_write;
        bytes += q.length();
      }
      if (small_reads && bytes <= SharedReads::kBytesMax) return shared_->run(requests);
    }
    Ring& r = threadRing();
    if (r.init_error != 0)
      return Status(ErrorCode::kIOError, fmt::format("io_uring: {}", std::strerror(r.init_error)));
    for (size_t first = 0; first < requests.size(); first += kRingEntries) {
      size_t n = std::min<size_t>(kRingEntries, requests.size() - first);
      for (size_t i = 0; i < n; ++i) {
        IoRequest& q = requests[first + i];
        io_uring_sqe* sqe = io_uring_get_sqe(&r.ring);
        prepareUring(sqe, q);
        io_uring_sqe_set_data64(sqe, first + i);
      }
      int submitted;
      do {
        submitted = io_uring_submit_and_wait(&r.ring, static_cast<unsigned>(n));
      } while (submitted == -EINTR);
      if (submitted < 0) {
        return Status(ErrorCode::kIOError,
                      fmt::format("io_uring submit: {}", std::strerror(-submitted)));
      }
      // Reap every completion before returning, even after an error: the
      // buffers belong to the caller once run() returns.
      Status first_error;
      for (size_t done = 0; done < n;) {
        io_uring_cqe* cqe;
        int w;
        do {
          w = io_uring_wait_cqe(&r.ring, &cqe);
        } while (w == -EINTR);
        if (w < 0)
          return Status(ErrorCode::kIOError, fmt::format("io_uring wait: {}", std::strerror(-w)));
        const IoRequest& q = requests[io_uring_cqe_get_data64(cqe)];
        int res = cqe->res;
        io_uring_cqe_seen(&r.ring, cqe);
        ++done;
        if (first_error.ok()) first_error = settle(q, res);
      }
      RETURN_ON_ERROR(first_error);
    }
    return Status::OK();
  }
  std::string_view name() const override { return "io_uring"; }

 private:
  std::unique_ptr<SharedReads> shared_;  // null: every read on the caller's ring
};

}  // namespace

void zeroFrom(const IoRequest& r, size_t done) {
  for (int i = 0; i < r.iovcnt; ++i) {
    size_t at = std::min(done, r.iov[i].iov_len);
    std::memset(static_cast<uint8_t*>(r.iov[i].iov_base) + at, 0, r.iov[i].iov_len - at);
    done -= at;
  }
}

void prepareUring(io_uring_sqe* sqe, IoRequest& q) {
  if (q.is_write)
    io_uring_prep_writev(sqe, q.fd, q.iov, static_cast<unsigned>(q.iovcnt), q.pos);
  else
    io_uring_prep_readv(sqe, q.fd, q.iov, static_cast<unsigned>(q.iovcnt), q.pos);
}

Result<std::unique_ptr<IoBackend>> makeIoBackend(std::string_view name) {
  if (name == "psync") return std::unique_ptr<IoBackend>(new PsyncBackend());
  if (name == "io_uring") {
    if (int err = threadRing().init_error; err != 0) {
      return Status(ErrorCode::kNotSupported,
                    fmt::format("io_uring is not available here: {}", std::strerror(err)));
    }
    return std::unique_ptr<IoBackend>(new UringBackend());
  }
  return Status(ErrorCode::kInvalidArgument,
                fmt::format("unknown I/O engine '{}' (io_uring or psync)", name));
}

}  // namespace cistern::storage
