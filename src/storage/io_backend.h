// IoBackend: how the chunk engine moves bytes between buffers and group files.
//
// A request is one positioned read or write of up to two buffers. run()
// performs a set of requests and returns when all are done: the io_uring
// backend submits them together (one system call for the data and CRC I/O of
// a chunk access), the psync backend runs pread/pwrite one after the other.
// Both give the same results: reads past the end of a file fill the rest
// with zeros (a direct read that ends inside a block, without reading on
// from that unaligned place), short transfers are completed, EINTR is
// retried, and the first error is returned as kIOError or kNoSpace (ENOSPC)
// naming the operation.
// The io_uring backend keeps one small ring per thread that uses it.
#pragma once

#include <sys/uio.h>

#include <memory>
#include <span>
#include <string_view>

#include "common/result.h"

struct io_uring_sqe;

namespace cistern::storage {

struct IoRequest {
  bool is_write = false;
  int fd = -1;
  iovec iov[2] = {};
  int iovcnt = 1;
  uint64_t pos = 0;

  static IoRequest readOf(int fd, void* buf, size_t n, uint64_t pos) {
    return IoRequest{false, fd, {{buf, n}, {}}, 1, pos};
  }
  static IoRequest writeOf(int fd, const void* buf, size_t n, uint64_t pos) {
    return IoRequest{true, fd, {{const_cast<void*>(buf), n}, {}}, 1, pos};
  }
  size_t length() const { return iov[0].iov_len + (iovcnt > 1 ? iov[1].iov_len : 0); }
};

class IoBackend {
 public:
  virtual ~IoBackend() = default;
  virtual Status run(std::span<IoRequest> requests) = 0;
  virtual std::string_view name() const = 0;
};

// A read that transferred only `done` bytes: the rest of its buffers read as
// zeros (past the end of the file).
void zeroFrom(const IoRequest& r, size_t done);

// Fills `sqe` with request `q` (readv or writev).
void prepareUring(io_uring_sqe* sqe, IoRequest& q);

// The backends makeIoBackend() makes, by name.
inline constexpr std::string_view kIoEngineNames[] = {"io_uring", "psync"};
// kInvalidArgument naming the choices unless `name` is one of kIoEngineNames.
Status checkIoEngineName(std::string_view name);

// "io_uring" or "psync". kNotSupported if io_uring cannot be set up here;
// kInvalidArgument for another name.
Result<std::unique_ptr<IoBackend>> makeIoBackend(std::string_view name);

}  // namespace cistern::storage
