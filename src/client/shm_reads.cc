#include "client/shm_reads.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/host.h"
#include "common/log.h"
#include "storage.pb.h"

namespace cistern::client {

std::unique_ptr<ShmReads> ShmReads::create(uint32_t slots, uint32_t slot_bytes) {
  if (slots == 0 || slot_bytes == 0 || slot_bytes % 4096 != 0 || hostBootId().empty()) {
    return nullptr;
  }
  std::unique_ptr<ShmReads> r(new ShmReads());
  r->slot_bytes_ = slot_bytes;
  r->bytes_ = kHeaderBytes + uint64_t{slots} * slot_bytes;
  r->fd_ = ::memfd_create("cistern-reads", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  // Sealed against shrinking: servers refuse memory that could be cut
  // under their mapping (a write past the end would kill them with SIGBUS).
  if (r->fd_ < 0 || ::ftruncate(r->fd_, static_cast<off_t>(r->bytes_)) != 0 ||
      ::fcntl(r->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    CLOG_INFO("client", "no shared memory for same-host reads: {}", std::strerror(errno));
    return nullptr;
  }
  void* p = ::mmap(nullptr, r->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd_, 0);
  if (p == MAP_FAILED) {
    CLOG_INFO("client", "no shared memory for same-host reads: mmap: {}", std::strerror(errno));
    return nullptr;
  }
  r->base_ = static_cast<uint8_t*>(p);
  r->token_.resize(32);
  if (::getrandom(r->token_.data(), r->token_.size(), 0) !=
      static_cast<ssize_t>(r->token_.size())) {
    CLOG_INFO("client", "no shared memory for same-host reads: getrandom: {}",
              std::strerror(errno));
    return nullptr;
  }
  std::memcpy(r->base_, r->token_.data(), r->token_.size());
  for (int i = static_cast<int>(slots) - 1; i >= 0; --i) r->free_.push_back(i);
  return r;
}

ShmReads::~ShmReads() {
  if (base_) ::munmap(base_, bytes_);
  if (fd_ >= 0) ::close(fd_);
}

int ShmReads::take() {
  std::lock_guard lock(mu_);
  if (free_.empty()) return -1;
  int s = free_.back();
  free_.pop_back();
  return s;
}

void ShmReads::give(int slot, bool clean) {
  if (!clean) {
    CLOG_WARN("client", "shared memory slot {} retired: a server may still write into it", slot);
    return;
  }
  std::lock_guard lock(mu_);
  free_.push_back(slot);
}

void ShmReads::fillAttach(storage::ShmAttachReq* req) const {
  req->set_boot_id(hostBootId());
  req->set_pid(static_cast<uint32_t>(::getpid()));
  req->set_fd(static_cast<uint32_t>(fd_));
  req->set_bytes(bytes_);
  req->set_token(token_);
}

uint64_t ShmReads::handleFor(const std::string& endpoint) {
  std::lock_guard lock(mu_);
  uint64_t& h = handles_[endpoint];
  if (h == kNotTried) {
    h = kAttaching;
    return kNotTried;
  }
  return h;
}

void ShmReads::setHandle(const std::string& endpoint, uint64_t handle) {
  std::lock_guard lock(mu_);
  handles_[endpoint] = handle;
}

std::vector<std::pair<std::string, uint64_t>> ShmReads::attached() const {
  std::lock_guard lock(mu_);
  std::vector<std::pair<std::string, uint64_t>> out;
  for (const auto& [ep, h] : handles_) {
    if (h != kNotTried && h != kAttaching && h != kRefused) out.emplace_back(ep, h);
  }
  return out;
}

}  // namespace cistern::client
