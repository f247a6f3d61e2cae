#include "net/sync_connection.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <google/protobuf/message.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>

#include "common/crc32c.h"
#include "common/log.h"
#include "net/method.h"
#include "net/rpc_client.h"

namespace cistern::net {
namespace {

// Lets CancelToken::cancel() on another thread wake a call blocked in send or recv:
// it shuts the socket down. The call clears `fd` (under `mu`) before the
// descriptor can be closed or reused.
struct CancelHook {
  std::mutex mu;
  int fd = -1;
};

int remainingMs(SteadyTime deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                  deadline - std::chrono::steady_clock::now())
                  .count();
  // Round up so that a wait never ends before the deadline.
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left + 1, 1 << 30));
}

}  // namespace

FrameHeader requestHeader(const Method& method, const google::protobuf::Message& request,
                          const CallOptions& options, uint32_t timeout_ms, bool payload_crc,
                          uint64_t request_id, std::string* message) {
  message->assign(options.credential);
  request.AppendToString(message);
  FrameHeader h;
  h.credential_len = static_cast<uint16_t>(options.credential.size());
  h.request_id = request_id;
  h.method = method.id;
  h.deadline_ms = timeout_ms;
  h.tenant_token = options.tenant_token;
  h.priority = options.priority;
  h.message_len = static_cast<uint32_t>(message->size());
  h.payload_len = static_cast<uint32_t>(options.request_payload.size());
  uint32_t crc = crc32c(message->data(), message->size());
  if (payload_crc && !options.request_payload.empty()) {
    h.flags |= kFlagPayloadCrc;
    crc = crc32cExtend(crc, options.request_payload.data(), options.request_payload.size());
  }
  h.body_crc = crc;
  return h;
}

SyncConnection::SyncConnection(Endpoint endpoint, const ClientOptions& options)
    : endpoint_(std::move(endpoint)), options_(options) {}

SyncConnection::~SyncConnection() { close(); }

void SyncConnection::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  in_.clear();
}

Status SyncConnection::transportError(std::string_view what, int err) const {
  return Status(ErrorCode::kConnectionClosed,
                fmt::format("{} {}: {}", what, endpoint_.toString(), std::strerror(err)));
}

void SyncConnection::dropIfClosedByPeer() {
  if (fd_ < 0) return;
  if (!in_.empty()) {  // bytes nobody asked for
    close();
    return;
  }
  // A connection used moments ago is trusted without a system call: a peer
  // that closed it since answers the next call with EOF (kConnectionClosed,
  // which callers retry like any lost connection). One that sat idle is
  // checked first; readable means EOF, a reset, or unasked bytes.
  if (std::chrono::steady_clock::now() - last_used_ < kTrustedIdle) return;
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, 0) != 0) close();
}

Status SyncConnection::connect(SteadyTime deadline) {
  SteadyTime connect_deadline =
      std::min(deadline, std::chrono::steady_clock::now() +
                             std::chrono::milliseconds(options_.connect_timeout_ms));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port = std::to_string(endpoint_.port);
  if (int rc = ::getaddrinfo(endpoint_.host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return Status(ErrorCode::kConnectionFailed,
                  fmt::format("connect to {}: {}", endpoint_.toString(), ::gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, &::freeaddrinfo);
  std::string why = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int err = 0;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        int n;
        do {
          n = ::poll(&p, 1, remainingMs(connect_deadline));
        } while (n < 0 && errno == EINTR);
        socklen_t len = sizeof err;
        if (n == 0) {
          err = ETIMEDOUT;
        } else if (n < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
          err = errno;
        }
      }
    }
    if (err != 0) {
      why = std::strerror(err);
      ::close(fd);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // Calls block in send/recv, bounded by the socket's timeouts (arm()).
    int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      continue;
    }
    fd_ = fd;
    armed_ = std::chrono::milliseconds(0);
    in_.clear();
    return Status::OK();
  }
  return Status(ErrorCode::kConnectionFailed,
                fmt::format("connect to {}: {}", endpoint_.toString(), why));
}

Status SyncConnection::arm(SteadyTime deadline, const CallOptions& options) {
  if (options.cancel && options.cancel->cancelled()) {
    return Status(ErrorCode::kCancelled, call_name_);
  }
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) {
    return Status(ErrorCode::kDeadlineExceeded,
                  fmt::format("{} after {} ms", call_name_, call_timeout_ms_));
  }
  // A blocked send or recv must not outlast the deadline; a timeout far
  // below what is left would only add wake-ups. Three quarters of what is
  // left keeps calls with the same timeout from setting it again each time.
  if (armed_ > left || armed_ < left / 2) {
    auto ms = std::max<int64_t>(1, left.count() * 3 / 4);
    timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>(ms % 1000 * 1000)};
    if (::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
        ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
      return transportError("set timeouts of connection to", errno);
    }
    armed_ = std::chrono::milliseconds(ms);
  }
  return Status::OK();
}

Status SyncConnection::cancelledOr(Status s, const CallOptions& options) const {
  if (options.cancel && options.cancel->cancelled()) {
    return Status(ErrorCode::kCancelled, call_name_);
  }
  return s;
}

Status SyncConnection::writeAll(std::span<iovec> iov, SteadyTime deadline,
                                const CallOptions& options) {
  while (!iov.empty()) {
    RETURN_ON_ERROR(arm(deadline, options));
    msghdr m{};
    m.msg_iov = iov.data();
    m.msg_iovlen = iov.size();
    ssize_t n = ::sendmsg(fd_, &m, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;  // arm() tells a deadline
      return cancelledOr(transportError("write to", errno), options);
    }
    auto left = static_cast<size_t>(n);
    while (!iov.empty() && left >= iov.front().iov_len) {
      left -= iov.front().iov_len;
      iov = iov.subspan(1);
    }
    if (!iov.empty()) {
      iov.front().iov_base = static_cast<char*>(iov.front().iov_base) + left;
      iov.front().iov_len -= left;
    }
  }
  return Status::OK();
}

Status SyncConnection::read(std::span<uint8_t> out, SteadyTime deadline, const CallOptions& options,
                            uint32_t* crc) {
  out = out.subspan(in_.take(out, crc));
  while (!out.empty()) {
    RETURN_ON_ERROR(arm(deadline, options));
    std::span<uint8_t> into = in_.target(out);
    ssize_t n = ::recv(fd_, into.data(), into.size(), 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;  // arm() tells a deadline
      return cancelledOr(transportError("read from", errno), options);
    }
    if (n == 0) {
      return cancelledOr(
          Status(ErrorCode::kConnectionClosed,
                 fmt::format("read from {}: connection closed by the peer", endpoint_.toString())),
          options);
    }
    out = out.subspan(in_.landed(out, into, static_cast<size_t>(n), crc));
  }
  return Status::OK();
}

Status SyncConnection::call(const Method& method, const google::protobuf::Message& request,
                            google::protobuf::Message* response, const CallOptions& options,
                            uint32_t timeout_ms) {
  SteadyTime deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  call_name_ = method.name;
  call_timeout_ms_ = timeout_ms;
  dropIfClosedByPeer();
  if (fd_ < 0) RETURN_ON_ERROR(connect(deadline));

  std::shared_ptr<CancelHook> hook;
  uint64_t cancel_sub = 0;
  if (options.cancel) {
    hook = std::make_shared<CancelHook>();
    hook->fd = fd_;
    cancel_sub = options.cancel->subscribe([hook] {
      std::lock_guard lock(hook->mu);
      if (hook->fd >= 0) ::shutdown(hook->fd, SHUT_RDWR);
    });
  }
  bool in_step = false;  // the whole answer was read: the stream is usable
  Status s = [&]() -> Status {
    uint64_t id = next_request_id_++;
    FrameHeader h =
        requestHeader(method, request, options, timeout_ms, options_.payload_crc, id, &message_);
    uint8_t hbuf[kHeaderSize];
    encodeHeader(h, hbuf);
    iovec iov[3];
    size_t n = 0;
    iov[n++] = {hbuf, kHeaderSize};
    if (!message_.empty()) iov[n++] = {message_.data(), message_.size()};
    if (!options.request_payload.empty()) {
      iov[n++] = {const_cast<uint8_t*>(options.request_payload.data()),
                  options.request_payload.size()};
    }
    RETURN_ON_ERROR(writeAll(std::span(iov, n), deadline, options));
    uint8_t rbuf[kHeaderSize];
    RETURN_ON_ERROR(read(rbuf, deadline, options, nullptr));
    auto rh = decodeHeader(rbuf, options_.limits);
    if (!rh.ok()) return rh.status();
    if (!rh->isResponse() || rh->request_id != id) {
      return Status(ErrorCode::kBadFrame,
                    fmt::format("{} answered request {} with {} {}", endpoint_.toString(), id,
                                rh->isResponse() ? "response" : "request", rh->request_id));
    }
    message_.resize(rh->message_len);
    uint32_t crc = 0;
    RETURN_ON_ERROR(read({reinterpret_cast<uint8_t*>(message_.data()), message_.size()}, deadline,
                         options, &crc));
    Status result;
    if (rh->status != 0) result = Status(static_cast<ErrorCode>(rh->status), message_);
    std::span<uint8_t> dest = options.response_payload;
    if (result.ok() && rh->payload_len > dest.size()) {
      result = Status(ErrorCode::kPayloadTooLarge,
                      fmt::format("response payload of {} bytes exceeds the {} byte buffer",
                                  rh->payload_len, dest.size()));
    }
    uint32_t* pcrc = rh->payloadChecksummed() ? &crc : nullptr;
    if (result.ok()) {
      RETURN_ON_ERROR(read(dest.first(rh->payload_len), deadline, options, pcrc));
    } else {
      // Nobody wants these bytes (an error, too large): drain them.
      uint8_t scratch[4096];
      for (size_t left = rh->payload_len; left > 0;) {
        size_t k = std::min(left, sizeof scratch);
        RETURN_ON_ERROR(read({scratch, k}, deadline, options, pcrc));
        left -= k;
      }
    }
    if (crc != rh->body_crc) {
      CLOG_WARN("net", "closing connection to {}: body checksum mismatch", endpoint_.toString());
      return Status(ErrorCode::kBadFrame, "response body checksum mismatch");
    }
    in_step = true;
    if (result.ok() && response &&
        !response->ParseFromArray(message_.data(), static_cast<int>(message_.size()))) {
      return Status(ErrorCode::kBadMessage, "cannot parse the response message");
    }
    if (result.ok() && options.response_payload_len) {
      *options.response_payload_len = rh->payload_len;
    }
    return result;
  }();
  if (hook) {
    {
      std::lock_guard lock(hook->mu);
      hook->fd = -1;
    }
    options.cancel->unsubscribe(cancel_sub);
  }
  // A call that ended before its whole answer was read (deadline, cancel, a
  // broken or garbled stream) leaves the stream out of step: start afresh.
  if (!in_step) close();
  last_used_ = std::chrono::steady_clock::now();
  return s;
}

}  // namespace cistern::net
