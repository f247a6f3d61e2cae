// BufferedTxn: a transaction of the KV engines (kv/engine.h) over a
// snapshot of their state: reads come from the snapshot merged with the
// transaction's own buffered writes (sets, clears, clear-ranges, atomic adds),
// the ranges it read are recorded for the conflict check, and commit() hands
// the whole of it to its engine (the TxnHost): the OCC engine checks it
// against its history (kv/occ_engine.h), the etcd engine turns it into one
// etcd transaction (kv/etcd_engine.h). Internal to src/kv.
#pragma once

#include <fmt/format.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "kv/engine.h"
#include "kv/store.h"

namespace cistern::kv {

// Keys from here up belong to the stores (rocks_store.cc: the applied version).
inline constexpr std::string_view kReservedKeys = "\xff\xff";

// The smallest key after `key`.
inline std::string keyAfter(std::string_view key) {
  std::string s(key);
  s.push_back('\0');
  return s;
}

struct KeyRange {
  std::string begin;  // inclusive
  std::string end;    // exclusive
};

// Sorts and merges overlapping or touching ranges in place.
void normalizeRanges(std::vector<KeyRange>* ranges);
// True when two normalized lists share a key.
bool rangesIntersect(const std::vector<KeyRange>& a, const std::vector<KeyRange>& b);

class BufferedTxn;

// The engine a BufferedTxn belongs to.
class TxnHost {
 public:
  virtual ~TxnHost() = default;
  virtual const EngineOptions& options() const = 0;
  virtual Clock& clock() = 0;
  // A read-write transaction at `read_version` ends (it was registered when it began).
  virtual void releaseRead(uint64_t read_version) = 0;
  // Commits a transaction with writes (checked: not too old, not failed).
  virtual Status commit(BufferedTxn& txn) = 0;
};

class BufferedTxn final : public Transaction {
 public:
  BufferedTxn(TxnHost* host, std::shared_ptr<StoreSnapshot> snap, uint64_t read_version,
              bool read_only)
      : host_(host),
        snap_(std::move(snap)),
        read_version_(read_version),
        read_only_(read_only),
        start_(host->clock().now()) {}

  ~BufferedTxn() override {
    if (!read_only_) host_->releaseRead(read_version_);
  }

  Result<std::optional<std::string>> get(std::string_view key, bool snapshot) override {
    if (finished_) return Status(ErrorCode::kTxnFinished, "get after commit");
    if (auto it = writes_.find(key); it != writes_.end()) return it->second;
    if (coveredByClear(key)) return std::optional<std::string>();
    if (!snapshot && !read_only_) reads_.push_back({std::string(key), keyAfter(key)});
    auto stored = snap_->get(key);
    if (auto add = adds_.find(key); stored.ok() && add != adds_.end()) {
      int64_t base = *stored ? decodeCounter(**stored) : 0;
      return std::optional<std::string>(encodeCounter(base + add->second));
    }
    return stored;
  }

  Result<RangeResult> getRange(std::string_view begin, std::string_view end,
                               const RangeOptions& opts) override;

  uint64_t readVersion() const override { return read_version_; }

  void set(std::string_view key, std::string_view value) override {
    if (!checkWritable(key)) return;
    if (value.size() > host_->options().value_bytes_max) {
      fail(Status(ErrorCode::kValueTooLarge,
                  fmt::format("value of {} bytes exceeds {}", value.size(),
                              host_->options().value_bytes_max)));
      return;
    }
    if (!account(key.size() + value.size())) return;
    writes_.insert_or_assign(std::string(key), std::optional<std::string>(value));
    eraseAdd(key);
  }

  void clear(std::string_view key) override {
    if (!checkWritable(key) || !account(key.size())) return;
    writes_.insert_or_assign(std::string(key), std::optional<std::string>());
    eraseAdd(key);
  }

  void atomicAdd(std::string_view key, int64_t delta) override {
    if (!checkWritable(key) || !account(key.size() + 8)) return;
    if (auto it = writes_.find(key); it != writes_.end()) {
      int64_t base = it->second ? decodeCounter(*it->second) : 0;
      it->second = encodeCounter(base + delta);
    } else if (coveredByClear(key)) {
      writes_.insert_or_assign(std::string(key), std::optional<std::string>(encodeCounter(delta)));
    } else {
      adds_[std::string(key)] += delta;
    }
  }

  void clearRange(std::string_view begin, std::string_view end) override {
    // `end` is exclusive: a range may end exactly at the reserved keys.
    if (!checkWritable(begin) || (end != kReservedKeys && !checkWritable(end))) return;
    if (begin >= end) return;
    if (!account(begin.size() + end.size())) return;
    writes_.erase(writes_.lower_bound(begin), writes_.lower_bound(end));
    adds_.erase(adds_.lower_bound(begin), adds_.lower_bound(end));
    clears_.push_back({std::string(begin), std::string(end)});
  }

  Status commit() override {
    if (!error_.ok()) {
      finished_ = true;
      return error_;
    }
    if (finished_) return Status(ErrorCode::kTxnFinished, "commit called twice");
    finished_ = true;
    if (writes_.empty() && clears_.empty() && adds_.empty()) {
      commit_version_ = read_version_;  // a read-only commit has nothing to check
      return Status::OK();
    }
    auto age = host_->clock().now() - start_;
    if (age > std::chrono::milliseconds(host_->options().txn_lifetime_ms_max)) {
      return Status(ErrorCode::kTxnTooOld, "transaction outlived txn_lifetime_ms_max");
    }
    return host_->commit(*this);
  }

  uint64_t commitVersion() const override { return commit_version_; }
  void setDurability(Durability d) override { durability_ = d; }

 private:
  friend class OccEngine;
  friend class EtcdEngine;

  bool coveredByClear(std::string_view key) const {
    for (const auto& r : clears_) {
      if (r.begin <= key && key < r.end) return true;
    }
    return false;
  }

  void fail(Status s) {
    if (error_.ok()) error_ = std::move(s);
  }

  bool checkWritable(std::string_view key) {
    if (!error_.ok()) return false;
    if (read_only_) {
      fail(Status(ErrorCode::kTxnReadOnly, "write in a read-only transaction"));
      return false;
    }
    if (finished_) {
      fail(Status(ErrorCode::kTxnFinished, "write after commit"));
      return false;
    }
    if (key.starts_with(kReservedKeys)) {
      fail(Status(ErrorCode::kInvalidArgument, "keys from \\xff\\xff up are reserved"));
      return false;
    }
    if (key.size() > host_->options().key_bytes_max) {
      fail(Status(ErrorCode::kKeyTooLarge, fmt::format("key of {} bytes exceeds {}", key.size(),
                                                       host_->options().key_bytes_max)));
      return false;
    }
    return true;
  }

  bool account(size_t n) {
    bytes_ += n;
    if (bytes_ > host_->options().txn_bytes_max) {
      fail(Status(ErrorCode::kTxnTooLarge, fmt::format("transaction writes exceed {} bytes",
                                                       host_->options().txn_bytes_max)));
      return false;
    }
    return true;
  }

  void eraseAdd(std::string_view key) {
    if (auto it = adds_.find(key); it != adds_.end()) adds_.erase(it);
  }

  // Pending adds inside [begin, end) become plain reads and writes, so that a
  // range read can merge them like any other write.
  Status materializeAdds(std::string_view begin, std::string_view end);

  // The ranges this transaction wrote, normalized; with `adds`, also the
  // counters it added to (others' reads conflict with those; others' adds do not).
  std::vector<KeyRange> writeRanges(bool adds) const {
    std::vector<KeyRange> out = clears_;
    for (const auto& [k, v] : writes_) out.push_back({k, keyAfter(k)});
    if (adds) {
      for (const auto& [k, d] : adds_) out.push_back({k, keyAfter(k)});
    }
    normalizeRanges(&out);
    return out;
  }

  void appendOps(WriteBatch* batch) const {
    for (const auto& r : clears_) batch->push_back({WriteOp::kClearRange, r.begin, r.end});
    for (const auto& [k, v] : writes_) {
      if (v)
        batch->push_back({WriteOp::kSet, k, *v});
      else
        batch->push_back({WriteOp::kClear, k, {}});
    }
    for (const auto& [k, d] : adds_) batch->push_back({WriteOp::kAdd, k, encodeCounter(d)});
  }

  TxnHost* host_;
  std::shared_ptr<StoreSnapshot> snap_;
  uint64_t read_version_;
  bool read_only_;
  SteadyTime start_;
  std::map<std::string, std::optional<std::string>, std::less<>> writes_;
  std::vector<KeyRange> clears_;
  std::vector<KeyRange> reads_;
  std::map<std::string, int64_t, std::less<>> adds_;
  uint64_t bytes_ = 0;
  Status error_;
  bool finished_ = false;
  uint64_t commit_version_ = 0;
  Durability durability_ = Durability::kSynced;
};

}  // namespace cistern::kv
