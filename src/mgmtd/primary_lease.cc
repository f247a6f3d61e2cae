// The mgmtd primary by an etcd lease (primary_lease.h).
#include "mgmtd/primary_lease.h"

#include "common/log.h"

namespace cistern::mgmtd {

PrimaryLease::PrimaryLease(kv::etcd::Client* client, std::string key, std::string me,
                           uint32_t ttl_ms)
    : client_(client), key_(std::move(key)), me_(std::move(me)), ttl_ms_(ttl_ms) {
  thread_ = std::thread([this] { loop(); });
}

PrimaryLease::~PrimaryLease() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (lease_ != 0) (void)client_->leaseRevoke(lease_);  // the key goes with it
}

bool PrimaryLease::isPrimary() const {
  std::lock_guard lock(mu_);
  return std::chrono::steady_clock::now() < primary_until_;
}

std::string PrimaryLease::primary() const {
  std::lock_guard lock(mu_);
  return primary_;
}

void PrimaryLease::loop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    lock.unlock();
    campaign();
    lock.lock();
    cv_.wait_for(lock, std::chrono::milliseconds(ttl_ms_ / 3), [this] { return stop_; });
  }
}

void PrimaryLease::campaign() {
  const auto renewed_at = std::chrono::steady_clock::now();
  // etcd counts leases in whole seconds (and raises short ones to its own
  // minimum): never shorter than what this process assumes.
  const int64_t ttl_s = std::max<int64_t>(1, (ttl_ms_ + 999) / 1000);
  if (lease_ == 0) {
    auto granted = client_->leaseGrant(ttl_s);
    if (!granted.ok()) {
      CLOG_WARN("mgmtd", "primary lease: {}", granted.status().toString());
      return;
    }
    lease_ = *granted;
  } else if (Status s = client_->leaseKeepAlive(lease_); !s.ok()) {
    CLOG_WARN("mgmtd", "primary lease {:x}: {}", lease_, s.toString());
    if (s.code() == ErrorCode::kNotFound) {
      lease_ = 0;  // expired: the key went with it
      std::lock_guard lock(mu_);
      primary_until_ = {};
    }
    return;
  }
  kv::etcd::TxnRequest txn;
  txn.compare.push_back({key_, {}, kv::etcd::Compare::kCreate, kv::etcd::Compare::kEqual, 0, {}});
  txn.success.push_back({kv::etcd::Op::kPut, key_, me_, {}, lease_, {}, nullptr});
  kv::etcd::Op read{kv::etcd::Op::kRange, {}, {}, {}, 0, {}, nullptr};
  read.range.key = key_;
  txn.failure.push_back(std::move(read));
  auto resp = client_->txn(txn);
  if (!resp.ok()) {
    CLOG_WARN("mgmtd", "primary key: {}", resp.status().toString());
    return;
  }
  std::string holder = me_;
  if (!resp->succeeded) {
    holder.clear();
    if (!resp->responses.empty() && !resp->responses.front().range.kvs.empty())
      holder = resp->responses.front().range.kvs.front().value;
  }
  std::lock_guard lock(mu_);
  const bool was = std::chrono::steady_clock::now() < primary_until_;
  primary_ = holder;
  if (holder == me_) {
    primary_until_ = renewed_at + std::chrono::milliseconds(ttl_ms_ * 2 / 3);
    if (!was) CLOG_INFO("mgmtd", "{} is the primary mgmtd", me_);
  } else {
    primary_until_ = {};
    if (was) CLOG_WARN("mgmtd", "{} is no longer primary ({} is)", me_, holder);
  }
}

}  // namespace cistern::mgmtd
