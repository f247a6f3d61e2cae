// PrimaryLease: which of a cluster's mgmtd processes is primary, decided by
// an etcd lease (docs/chain_protocol.md, "mgmtd primary").
//
// Each mgmtd holds a lease of `ttl_ms` and tries to create the primary key
// with it (a Txn that succeeds only while the key does not exist); the one
// that creates it is primary for as long as its lease lives, and renews it
// every third of the TTL. The others read who holds the key and try again
// every third of the TTL; when the primary dies its lease expires and the
// key with it, so a standby takes over within the TTL and a third.
//
// A primary that cannot renew steps down on its own: isPrimary() holds only
// until two thirds of the TTL after its last renewal (before etcd can let
// the lease go and another mgmtd take the key), so two primaries never act
// at once as long as clocks tick at the same rate.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "kv/etcd_client.h"

namespace cistern::mgmtd {

class PrimaryLease {
 public:
  // `key`: the primary key in etcd; `me`: what this mgmtd writes there (its
  // endpoint, for the others to name).
  PrimaryLease(kv::etcd::Client* client, std::string key, std::string me, uint32_t ttl_ms);
  ~PrimaryLease();  // revokes the lease: a clean stop hands over at once

  bool isPrimary() const;
  // The primary's `me` as last read ("" when unknown).
  std::string primary() const;

 private:
  void loop();
  void campaign();

  kv::etcd::Client* const client_;
  const std::string key_, me_;
  const uint32_t ttl_ms_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int64_t lease_ = 0;
  std::chrono::steady_clock::time_point primary_until_{};
  std::string primary_;
  std::thread thread_;
};

}  // namespace cistern::mgmtd
