#include "client/shm_slots.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/host.h"
#include "common/log.h"
#include "common/metrics.h"
#include "storage.pb.h"

namespace cistern::client {

std::unique_ptr<ShmSlots> ShmSlots::create(uint64_t bytes, uint32_t windows,
                                           uint64_t window_bytes) {
  if (bytes == 0 || hostBootId().empty()) return nullptr;
  const uint64_t slot_bytes = std::clamp<uint64_t>(bytes / 16 / 4096 * 4096, 64 << 10, 4 << 20);
  const uint64_t slots = std::max<uint64_t>(1, bytes / slot_bytes);
  window_bytes = (window_bytes + 4095) / 4096 * 4096;
  if (window_bytes == 0) windows = 0;
  std::unique_ptr<ShmSlots> r(new ShmSlots());
  r->slot_bytes_ = static_cast<uint32_t>(slot_bytes);
  r->window_bytes_ = window_bytes;
  r->windows_.assign(windows, WindowState::kFree);
  r->bytes_ = kHeaderBytes + slots * slot_bytes + windows * window_bytes;
  r->fd_ = ::memfd_create("cistern-io", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  // Sealed against shrinking: servers refuse memory that could be cut
  // under their mapping (a write past the end would kill them with SIGBUS).
  if (r->fd_ < 0 || ::ftruncate(r->fd_, static_cast<off_t>(r->bytes_)) != 0 ||
      ::fcntl(r->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    CLOG_INFO("client", "no shared memory for same-host I/O: {}", std::strerror(errno));
    return nullptr;
  }
  void* p = ::mmap(nullptr, r->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd_, 0);
  if (p == MAP_FAILED) {
    CLOG_INFO("client", "no shared memory for same-host I/O: mmap: {}", std::strerror(errno));
    return nullptr;
  }
  r->base_ = static_cast<uint8_t*>(p);
  r->windows_base_ = r->base_ + kHeaderBytes + slots * slot_bytes;
  r->token_.resize(32);
  if (::getrandom(r->token_.data(), r->token_.size(), 0) !=
      static_cast<ssize_t>(r->token_.size())) {
    CLOG_INFO("client", "no shared memory for same-host I/O: getrandom: {}", std::strerror(errno));
    return nullptr;
  }
  std::memcpy(r->base_, r->token_.data(), r->token_.size());
  for (int i = static_cast<int>(slots) - 1; i >= 0; --i) r->free_.push_back(i);
  return r;
}

ShmSlots::~ShmSlots() {
  if (base_) ::munmap(base_, bytes_);
  if (fd_ >= 0) ::close(fd_);
}

int ShmSlots::take() {
  std::lock_guard lock(mu_);
  if (free_.empty()) return -1;
  int s = free_.back();
  free_.pop_back();
  return s;
}

void ShmSlots::give(int slot, bool clean) {
  if (!clean) {
    CLOG_WARN("client", "shared memory slot {} retired: a server may still write into it", slot);
    return;
  }
  std::lock_guard lock(mu_);
  free_.push_back(slot);
}

int ShmSlots::lendWindow() {
  std::lock_guard lock(mu_);
  for (size_t w = 0; w < windows_.size(); ++w) {
    if (windows_[w] == WindowState::kFree) {
      windows_[w] = WindowState::kLent;
      return static_cast<int>(w);
    }
  }
  return -1;
}

std::optional<size_t> ShmSlots::windowOf(const uint8_t* p, uint64_t n) const {
  if (window_bytes_ == 0 || p < windows_base_) return std::nullopt;
  const uint64_t at = static_cast<uint64_t>(p - windows_base_);
  const uint64_t w = at / window_bytes_;
  if (w >= windows_.size() || at + n > (w + 1) * window_bytes_) return std::nullopt;
  return static_cast<size_t>(w);
}

std::optional<uint64_t> ShmSlots::windowOffset(const uint8_t* p, uint64_t n) const {
  if (!windowOf(p, n)) return std::nullopt;
  return static_cast<uint64_t>(p - base_);
}

void ShmSlots::poisonWindow(const uint8_t* p) {
  auto w = windowOf(p, 0);
  if (!w) return;
  std::lock_guard lock(mu_);
  if (windows_[*w] == WindowState::kLent) windows_[*w] = WindowState::kPoisoned;
}

bool ShmSlots::windowPoisoned(int w) const {
  std::lock_guard lock(mu_);
  return windows_[static_cast<size_t>(w)] == WindowState::kPoisoned;
}

void ShmSlots::returnWindow(int w) {
  std::lock_guard lock(mu_);
  WindowState& s = windows_[static_cast<size_t>(w)];
  if (s == WindowState::kPoisoned) {
    static auto& retired = metrics::Registry::global().counter(
        "client_shm_windows_retired_total", {},
        "Read-ahead windows given up because a server may still write into them");
    retired.inc();
    CLOG_WARN("client", "shared memory window {} retired: a server may still write into it", w);
    s = WindowState::kRetired;
    return;
  }
  s = WindowState::kFree;
}

void ShmSlots::fillAttach(storage::ShmAttachReq* req) const {
  req->set_boot_id(hostBootId());
  req->set_pid(static_cast<uint32_t>(::getpid()));
  req->set_fd(static_cast<uint32_t>(fd_));
  req->set_bytes(bytes_);
  req->set_token(token_);
}

uint64_t ShmSlots::handleFor(const net::Endpoint& server) {
  std::string key = server.toString();
  std::lock_guard lock(mu_);
  auto [it, fresh] = handles_.try_emplace(key, server, kNotTried);
  uint64_t& h = it->second.second;
  if (h == kNotTried) {
    h = kAttaching;
    return kNotTried;
  }
  return h;
}

void ShmSlots::setHandle(const net::Endpoint& server, uint64_t handle) {
  std::string key = server.toString();
  std::lock_guard lock(mu_);
  handles_.insert_or_assign(key, std::pair(server, handle));
}

void ShmSlots::dropHandle(const net::Endpoint& server, uint64_t handle) {
  std::lock_guard lock(mu_);
  auto it = handles_.find(server.toString());
  if (it != handles_.end() && it->second.second == handle) it->second.second = kNotTried;
}

std::vector<std::pair<net::Endpoint, uint64_t>> ShmSlots::attached() const {
  std::lock_guard lock(mu_);
  std::vector<std::pair<net::Endpoint, uint64_t>> out;
  for (const auto& [key, a] : handles_) {
    if (a.second != kNotTried && a.second != kAttaching && a.second != kRefused) out.push_back(a);
  }
  return out;
}

ShmWindow& ShmWindow::operator=(ShmWindow&& o) noexcept {
  if (this != &o) {
    release();
    shm_ = std::exchange(o.shm_, nullptr);
    shm_window_ = std::exchange(o.shm_window_, -1);
    heap_ = std::move(o.heap_);
  }
  return *this;
}

void ShmWindow::release() {
  if (shm_window_ >= 0) shm_->returnWindow(shm_window_);
  shm_window_ = -1;
}

bool ShmWindow::borrow(ShmSlots* shm, size_t n) {
  release();
  if (!shm || n > shm->windowBytes()) return false;
  shm_window_ = shm->lendWindow();
  shm_ = shm;
  return shm_window_ >= 0;
}

void ShmWindow::ensure(ShmSlots* shm, size_t n) {
  if (shm_window_ >= 0 && n <= shm_->windowBytes()) return;
  if (heap_.size() == 0 && borrow(shm, n)) return;
  release();
  heap_.ensure(n, /*huge=*/true);
}

bool ShmWindow::intact() {
  if (shm_window_ < 0 || !shm_->windowPoisoned(shm_window_)) return true;
  size_t n = shm_->windowBytes();
  release();  // retired for good
  heap_.ensure(n, /*huge=*/true);
  return false;
}

}  // namespace cistern::client
