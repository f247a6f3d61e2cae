// The in-memory Store: a multi-version ordered map.
//
// Each key keeps its recent versions (version, value-or-deleted). A snapshot
// is a version number; it sees, for each key, the newest version at or below
// it. Versions that no live snapshot can see are pruned when a key is written.
// Iterators copy rows out in small batches under a shared lock, so a long scan
// never blocks writers for long and never holds pointers into the map.
#include <fmt/format.h>

#include <map>
#include <set>
#include <shared_mutex>

#include "common/assert.h"
#include "kv/occ_engine.h"
#include "kv/store.h"

namespace cistern::kv {
namespace {

struct Version {
  uint64_t version;
  std::optional<std::string> value;  // nullopt: deleted
};

class MemStore;

class MemSnapshot final : public StoreSnapshot {
 public:
  MemSnapshot(MemStore* store, uint64_t version) : store_(store), version_(version) {}
  ~MemSnapshot() override;
  Result<std::optional<std::string>> get(std::string_view key) override;
  std::unique_ptr<StoreIterator> iterate(std::string_view begin, std::string_view end) override;

 private:
  MemStore* store_;
  uint64_t version_;
};

class MemStore final : public Store {
 public:
  std::shared_ptr<StoreSnapshot> snapshot() override {
    std::unique_lock lock(mu_);
    live_.insert(version_);
    return std::make_shared<MemSnapshot>(this, version_);
  }

  Status apply(const WriteBatch& batch, uint64_t version, bool /*sync*/) override {
    std::unique_lock lock(mu_);
    for (const WriteOp& op : batch) {
      switch (op.kind) {
        case WriteOp::kSet:
          put(op.key, version, op.value);
          break;
        case WriteOp::kClear:
          put(op.key, version, std::nullopt);
          break;
        case WriteOp::kAdd:
          CISTERN_CHECK(false, "kAdd reached the store");
          break;
        case WriteOp::kClearRange: {
          std::vector<std::string> keys;
          for (auto it = rows_.lower_bound(op.key); it != rows_.end() && it->first < op.value;
               ++it) {
            keys.push_back(it->first);
          }
          for (const auto& k : keys) put(k, version, std::nullopt);
          break;
        }
      }
    }
    version_ = version;
    return Status::OK();
  }

  std::string_view name() const override { return "mem"; }

  // Visible value of `key` at `version`; REQUIRES: mu_ held (shared).
  const std::optional<std::string>* visible(const std::vector<Version>& versions,
                                            uint64_t v) const {
    for (auto it = versions.rbegin(); it != versions.rend(); ++it) {
      if (it->version <= v) return &it->value;
    }
    return nullptr;
  }

  void release(uint64_t v) {
    std::unique_lock lock(mu_);
    live_.erase(live_.find(v));
  }

  std::shared_mutex mu_;
  std::map<std::string, std::vector<Version>, std::less<>> rows_;

 private:
  void put(const std::string& key, uint64_t version, std::optional<std::string> value) {
    auto& versions = rows_[key];
    versions.push_back({version, std::move(value)});
    // Keep the newest version at or below the oldest live snapshot, and all newer.
    uint64_t oldest = live_.empty() ? version : *live_.begin();
    size_t keep_from = 0;
    for (size_t i = 0; i < versions.size(); ++i) {
      if (versions[i].version <= oldest) keep_from = i;
    }
    versions.erase(versions.begin(), versions.begin() + static_cast<long>(keep_from));
    if (versions.size() == 1 && !versions[0].value && versions[0].version <= oldest) {
      rows_.erase(key);
    }
  }

  uint64_t version_ = 0;
  std::multiset<uint64_t> live_;
};

class MemIterator final : public StoreIterator {
 public:
  MemIterator(MemStore* store, uint64_t version, std::string_view begin, std::string_view end)
      : store_(store), version_(version), begin_(begin), end_(end) {}

  void seek(std::string_view key) override {
    forward_ = true;
    fill(std::max(std::string(key), begin_), /*inclusive=*/true);
  }
  void seekLast() override {
    forward_ = false;
    fill(end_, /*inclusive=*/false);
  }
  bool valid() const override { return pos_ < rows_.size(); }
  void next() override {
    CISTERN_CHECK(forward_, "next() on a backward iterator");
    advance();
  }
  void prev() override {
    CISTERN_CHECK(!forward_, "prev() on a forward iterator");
    advance();
  }
  std::string_view key() const override { return rows_[pos_].key; }
  std::string_view value() const override { return rows_[pos_].value; }
  Status status() const override { return Status::OK(); }

 private:
  static constexpr size_t kBatch = 256;

  void advance() {
    if (++pos_ < rows_.size()) return;
    if (exhausted_ || rows_.empty()) return;
    std::string last = rows_.back().key;
    fill(last, false);
  }

  // Loads the next batch starting at `from` (forward: >= or >; backward: < from).
  void fill(const std::string& from, bool inclusive) {
    rows_.clear();
    pos_ = 0;
    exhausted_ = false;
    std::shared_lock lock(store_->mu_);
    auto& m = store_->rows_;
    if (forward_) {
      auto it = inclusive ? m.lower_bound(from) : m.upper_bound(from);
      for (; it != m.end() && it->first < end_ && rows_.size() < kBatch; ++it) {
        const auto* v = store_->visible(it->second, version_);
        if (v && *v) rows_.push_back({it->first, **v});
      }
      exhausted_ = it == m.end() || it->first >= end_;
    } else {
      auto it = m.lower_bound(from);  // first >= from; we want those < from
      while (it != m.begin() && rows_.size() < kBatch) {
        --it;
        if (it->first < begin_) {
          exhausted_ = true;
          break;
        }
        const auto* v = store_->visible(it->second, version_);
        if (v && *v) rows_.push_back({it->first, **v});
      }
      if (it == m.begin()) exhausted_ = true;
    }
  }

  MemStore* store_;
  uint64_t version_;
  std::string begin_, end_;
  bool forward_ = true;
  std::vector<KeyValue> rows_;
  size_t pos_ = 0;
  bool exhausted_ = false;
};

MemSnapshot::~MemSnapshot() { store_->release(version_); }

Result<std::optional<std::string>> MemSnapshot::get(std::string_view key) {
  std::shared_lock lock(store_->mu_);
  auto it = store_->rows_.find(key);
  if (it == store_->rows_.end()) return std::optional<std::string>();
  const auto* v = store_->visible(it->second, version_);
  if (!v) return std::optional<std::string>();
  return *v;
}

std::unique_ptr<StoreIterator> MemSnapshot::iterate(std::string_view begin, std::string_view end) {
  return std::make_unique<MemIterator>(store_, version_, begin, end);
}

}  // namespace

std::unique_ptr<Engine> openMemEngine(const EngineOptions& options) {
  return std::make_unique<OccEngine>(std::make_unique<MemStore>(), options);
}

}  // namespace cistern::kv
