// libcistern: a file's life in meta beyond open: truncates (storage cut
// first, then the size), closes, and inline files moved to chunks.
#include <fmt/format.h>

#include <thread>

#include "client/client_impl.h"
#include "client/methods.h"

namespace cistern::client {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

Result<meta::Inode> ClientImpl::cutForTruncate(const meta::Caller& who, uint64_t ino, int mask,
                                               uint64_t new_size, uint64_t local_size) {
  meta::GetattrReq req;
  req.set_ino(ino);
  req.set_access_mask(static_cast<uint32_t>(mask));
  *req.mutable_caller() = who;
  meta::InodeResp resp;
  RETURN_ON_ERROR(metaCall(kGetattr(), req, &resp));
  noteCapability(ino, resp.capability());
  if (new_size <= std::max(resp.inode().size(), local_size))
    RETURN_ON_ERROR(cutData(resp.inode(), new_size));
  return resp.inode();
}

// The inode named by the first `count` components; every directory on the
// way must be searchable by the caller (the meta service checks).
Result<meta::Inode> ClientImpl::metaClose(uint64_t ino, uint64_t session, uint64_t length,
                                          bool wrote, const std::string* inline_data,
                                          bool durable) {
  meta::CloseReq req;
  req.set_ino(ino);
  req.set_session(session);
  req.set_length(length);
  req.set_wrote(wrote);
  req.set_sync(durable);
  if (inline_data) req.set_inline_data(*inline_data);
  stamp(&req);
  meta::InodeResp resp;
  Status s = metaCall(kClose(), req, &resp);
  forgetAttrs(ino);
  RETURN_ON_ERROR(s);
  return resp.inode();
}

Status ClientImpl::convertInline(uint64_t ino) {
  // The inline bytes may be an unsynced commit: durable before chunk 0
  // holds them (as before any handle's first chunk write, file.cc).
  RETURN_ON_ERROR(metaSync());
  // Another client's conversion holds the inode for at most the service's
  // lease (10 s): wait that long beyond the usual retries.
  auto deadline =
      Clock::now() + std::chrono::milliseconds(options_.retry_ms) + std::chrono::seconds(10);
  auto backoff = std::chrono::milliseconds(1);
  const std::string what = fmt::format("moving inline inode {} to chunks", ino);
  for (;;) {
    meta::UninlineReq begin;
    *begin.mutable_caller() = caller_;
    begin.set_ino(ino);
    stamp(&begin);
    meta::UninlineResp held;
    Status s = metaCall(kUninline(), begin, &held);
    if (s.code() == ErrorCode::kInodeBusy && Clock::now() + backoff < deadline) {
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
      continue;
    }
    RETURN_ON_ERROR(s.withContext(what));
    if (!held.was_inline()) break;
    // Chunk 0 becomes exactly the bytes. The lease fences the storage calls:
    // each is refused once the chunk is locked past the lease's end, less a
    // margin for the clocks of this service and the storage servers to
    // differ by, so a call of ours delayed past the lease cannot land after
    // those of the next client to take the inode (which begins only once
    // the lease has run out). Then the lease is lost: begin again.
    const int64_t not_after = held.inode().convert_until_ns() - kClockSkewNs;
    s = moveInlineBytes(held.inode(), held.data(), not_after);
    if (s.code() == ErrorCode::kLeaseExpired && Clock::now() < deadline) continue;
    RETURN_ON_ERROR(s.withContext(what));
    meta::UninlineReq finish = begin;
    finish.set_token(held.token());
    finish.set_seq(nextSeq());
    meta::UninlineResp done;
    s = metaCall(kUninline(), finish, &done);
    // The lease ran out and another client took over: once more (it finds the
    // bytes moved, or takes the inode again).
    if (s.code() == ErrorCode::kInlineRefused && Clock::now() < deadline) continue;
    RETURN_ON_ERROR(s.withContext(what));
    break;
  }
  forgetAttrs(ino);
  return Status::OK();
}

Status ClientImpl::prepareWrites(meta::OpenResp* resp) {
  if (!resp->inode().data_inline()) return Status::OK();
  Status s = convertInline(resp->inode().ino());
  if (!s.ok()) {
    (void)metaClose(resp->inode().ino(), resp->session(), 0, false);
    return s;
  }
  resp->mutable_inode()->set_data_inline(false);
  return Status::OK();
}

Status ClientImpl::setattrSize(meta::SetattrReq* req, meta::InodeResp* resp) {
  Status s = metaCall(kSetattr(), *req, resp);
  if (s.code() != ErrorCode::kInlineRefused) return s;
  RETURN_ON_ERROR(convertInline(req->ino()));
  req->set_seq(nextSeq());
  return metaCall(kSetattr(), *req, resp);
}

}  // namespace cistern::client
