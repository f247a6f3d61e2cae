#include "storage/io_backend.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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
  Status run(std::span<IoRequest> requests) override {
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
        if (!first_error.ok()) continue;
        if (res == -EINTR || res == -EAGAIN) {
          first_error = finish(q, 0);
        } else if (res < 0) {
          first_error = ioError(-res, q);
        } else if (static_cast<size_t>(res) < q.length()) {
          first_error = finish(q, static_cast<size_t>(res));
        }
      }
      RETURN_ON_ERROR(first_error);
    }
    return Status::OK();
  }
  std::string_view name() const override { return "io_uring"; }
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

Status checkIoEngineName(std::string_view name) {
  for (std::string_view known : kIoEngineNames) {
    if (name == known) return Status::OK();
  }
  return Status(ErrorCode::kInvalidArgument,
                fmt::format("unknown storage I/O engine '{}' (io_uring or psync)", name));
}

Result<std::unique_ptr<IoBackend>> makeIoBackend(std::string_view name) {
  RETURN_ON_ERROR(checkIoEngineName(name));
  if (name == "psync") return std::unique_ptr<IoBackend>(new PsyncBackend());
  if (int err = threadRing().init_error; err != 0) {  // io_uring
    return Status(ErrorCode::kNotSupported,
                  fmt::format("io_uring is not available here: {}", std::strerror(err)));
  }
  return std::unique_ptr<IoBackend>(new UringBackend());
}

}  // namespace cistern::storage
