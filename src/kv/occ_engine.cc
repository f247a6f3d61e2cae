#include "kv/occ_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "common/assert.h"
#include "common/fault.h"
#include "common/log.h"
#include "common/metrics.h"

namespace cistern::kv {
namespace {

// Keys from here up belong to the stores (rocks_store.cc: the applied version).
constexpr std::string_view kReservedKeys = "\xff\xff";

std::string keyAfter(std::string_view key) {
  std::string s(key);
  s.push_back('\0');
  return s;
}

struct KvMetrics {
  metrics::Counter& commits;
  metrics::Counter& conflicts;
  metrics::Counter& too_old;
  metrics::Histogram& batch_size;
  metrics::Histogram& commit_us;
  metrics::Histogram& log_us;
  metrics::Histogram& apply_us;
  metrics::Histogram& handoff_us;
  static KvMetrics& get() {
    auto& r = metrics::Registry::global();
    static KvMetrics m{
        r.counter("kv_commits_total", {}, "Committed read-write transactions"),
        r.counter("kv_conflicts_total", {}, "Transactions failed with a conflict"),
        r.counter("kv_too_old_total", {}, "Transactions failed as too old"),
        r.histogram("kv_commit_batch_size", {}, "Transactions per group commit"),
        r.histogram("kv_commit_latency_us", {}, "commit() latency"),
        r.histogram("kv_log_latency_us", {},
                    "Time to log one group-commit batch (durable when synced)"),
        r.histogram("kv_apply_latency_us", {}, "Time to apply one logged batch to the store"),
        r.histogram("kv_apply_handoff_us", {},
                    "From the log writer handing a logged batch to one of its "
                    "transactions' threads until that thread applies it")};
    return m;
  }
};

uint64_t micros(SteadyTime from, SteadyTime to) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(to - from).count());
}

}  // namespace

std::string encodeCounter(int64_t v) {
  std::string out(8, '\0');
  auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((u >> (8 * i)) & 0xff);
  return out;
}

int64_t decodeCounter(std::string_view bytes) {
  uint64_t u = 0;
  for (size_t i = 0; i < 8 && i < bytes.size(); ++i)
    u |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  return static_cast<int64_t>(u);
}

void normalizeRanges(std::vector<KeyRange>* ranges) {
  auto& r = *ranges;
  std::sort(r.begin(), r.end(),
            [](const KeyRange& a, const KeyRange& b) { return a.begin < b.begin; });
  size_t out = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r[i].begin >= r[i].end) continue;
    if (out > 0 && r[i].begin <= r[out - 1].end) {
      if (r[i].end > r[out - 1].end) r[out - 1].end = std::move(r[i].end);
    } else {
      if (out != i) r[out] = std::move(r[i]);
      ++out;
    }
  }
  r.resize(out);
}

bool rangesIntersect(const std::vector<KeyRange>& a, const std::vector<KeyRange>& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i].begin < b[j].end && b[j].begin < a[i].end) return true;
    if (a[i].end <= b[j].end)
      ++i;
    else
      ++j;
  }
  return false;
}

// ---------------------------------------------------------------------------
// TxnImpl

class TxnImpl final : public Transaction {
 public:
  TxnImpl(OccEngine* engine, std::shared_ptr<StoreSnapshot> snap, uint64_t read_version,
          bool read_only)
      : engine_(engine),
        snap_(std::move(snap)),
        read_version_(read_version),
        read_only_(read_only),
        start_(engine->clock().now()) {}

  ~TxnImpl() override {
    if (!read_only_) engine_->releaseRead(read_version_);
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
    if (value.size() > engine_->options().value_bytes_max) {
      fail(Status(ErrorCode::kValueTooLarge,
                  fmt::format("value of {} bytes exceeds {}", value.size(),
                              engine_->options().value_bytes_max)));
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
    auto age = engine_->clock().now() - start_;
    if (age > std::chrono::milliseconds(engine_->options().txn_lifetime_ms_max)) {
      return Status(ErrorCode::kTxnTooOld, "transaction outlived txn_lifetime_ms_max");
    }
    return engine_->commit(*this);
  }

  uint64_t commitVersion() const override { return commit_version_; }

 private:
  friend class OccEngine;

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
    if (key.size() > engine_->options().key_bytes_max) {
      fail(Status(ErrorCode::kKeyTooLarge, fmt::format("key of {} bytes exceeds {}", key.size(),
                                                       engine_->options().key_bytes_max)));
      return false;
    }
    return true;
  }

  bool account(size_t n) {
    bytes_ += n;
    if (bytes_ > engine_->options().txn_bytes_max) {
      fail(Status(ErrorCode::kTxnTooLarge, fmt::format("transaction writes exceed {} bytes",
                                                       engine_->options().txn_bytes_max)));
      return false;
    }
    return true;
  }

  void eraseAdd(std::string_view key) {
    if (auto it = adds_.find(key); it != adds_.end()) adds_.erase(it);
  }

  // Pending adds inside [begin, end) become plain reads and writes, so that a
  // range read can merge them like any other write.
  Status materializeAdds(std::string_view begin, std::string_view end) {
    auto lo = adds_.lower_bound(begin), hi = adds_.lower_bound(end);
    for (auto it = lo; it != hi; ++it) {
      reads_.push_back({it->first, keyAfter(it->first)});
      ASSIGN_OR_RETURN(auto stored, snap_->get(it->first));
      int64_t base = stored ? decodeCounter(*stored) : 0;
      writes_.insert_or_assign(it->first,
                               std::optional<std::string>(encodeCounter(base + it->second)));
    }
    adds_.erase(lo, hi);
    return Status::OK();
  }

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

  OccEngine* engine_;
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
};

Result<RangeResult> TxnImpl::getRange(std::string_view begin, std::string_view end,
                                      const RangeOptions& opts) {
  if (finished_) return Status(ErrorCode::kTxnFinished, "getRange after commit");
  RangeResult out;
  if (begin >= end) return out;
  RETURN_ON_ERROR(materializeAdds(begin, end));
  uint32_t limit = opts.limit == 0 ? kRangeLimitMax : std::min(opts.limit, kRangeLimitMax);
  auto it = snap_->iterate(begin, end);
  auto lo = writes_.lower_bound(begin);
  auto hi = writes_.lower_bound(end);
  bool stopped = false;

  if (!opts.reverse) {
    it->seek(begin);
    auto lit = lo;
    while (true) {
      bool store_ok = it->valid();
      bool local_ok = lit != hi;
      if (!store_ok && !local_ok) break;
      if (out.kvs.size() >= limit) {
        stopped = true;
        break;
      }
      int cmp = !store_ok ? 1 : !local_ok ? -1 : it->key().compare(lit->first);
      if (cmp < 0) {
        if (!coveredByClear(it->key()))
          out.kvs.push_back({std::string(it->key()), std::string(it->value())});
        it->next();
      } else {
        if (cmp == 0) it->next();  // the local write shadows the stored row
        if (lit->second) out.kvs.push_back({lit->first, *lit->second});
        ++lit;
      }
    }
  } else {
    it->seekLast();
    auto lit = hi;
    while (true) {
      bool store_ok = it->valid();
      bool local_ok = lit != lo;
      if (!store_ok && !local_ok) break;
      if (out.kvs.size() >= limit) {
        stopped = true;
        break;
      }
      auto prev = local_ok ? std::prev(lit) : lit;
      int cmp = !store_ok ? -1 : !local_ok ? 1 : it->key().compare(prev->first);
      if (cmp > 0) {
        if (!coveredByClear(it->key()))
          out.kvs.push_back({std::string(it->key()), std::string(it->value())});
        it->prev();
      } else {
        if (cmp == 0) it->prev();
        if (prev->second) out.kvs.push_back({prev->first, *prev->second});
        lit = prev;
      }
    }
  }
  RETURN_ON_ERROR(it->status());
  out.more = stopped;
  if (!opts.snapshot && !read_only_) {
    if (!stopped) {
      reads_.push_back({std::string(begin), std::string(end)});
    } else if (!opts.reverse) {
      reads_.push_back({std::string(begin), keyAfter(out.kvs.back().key)});
    } else {
      reads_.push_back({out.kvs.back().key, std::string(end)});
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// OccEngine

// A committing thread's transaction, in the group commit.
struct OccEngine::Pending {
  TxnImpl* txn;
  GroupCommit::Entry entry;
};

class OccEngine::Stages final : public GroupCommit::Stages {
 public:
  explicit Stages(OccEngine* engine) : engine_(engine) {}
  Status stage1(const std::vector<GroupCommit::Entry*>& batch) override {
    return engine_->formAndLog(batch);
  }
  Status stage2(const std::vector<GroupCommit::Entry*>& batch) override {
    return engine_->applyLogged(batch);
  }

 private:
  OccEngine* const engine_;
};

OccEngine::OccEngine(std::unique_ptr<Store> store, const EngineOptions& options)
    : store_(std::move(store)), options_(options) {
  committed_version_ = assigned_version_ = forgotten_version_ = store_->recoveredVersion();
  stages_ = std::make_unique<Stages>(this);
  GroupCommit::Options o;
  // Synced commits to a store with its own log: a log writer thread.
  o.stage1_thread = options_.sync_commits && store_->hasLog();
  o.thread_name = "kv-log";
  o.handoff_us = &KvMetrics::get().handoff_us;
  switch (options_.batch_applier) {
    case EngineOptions::BatchApplier::kAuto:
      o.stage2_runner = GroupCommit::Stage2Runner::kAuto;
      break;
    case EngineOptions::BatchApplier::kWriter:
      o.stage2_runner = GroupCommit::Stage2Runner::kStage1Thread;
      break;
    case EngineOptions::BatchApplier::kHandoff:
      o.stage2_runner = GroupCommit::Stage2Runner::kHandoff;
      break;
  }
  group_commit_ = std::make_unique<GroupCommit>(stages_.get(), o);
}

OccEngine::~OccEngine() {
  {
    std::lock_guard reads(reads_mu_);
    CISTERN_CHECK(active_reads_.empty(), "kv engine destroyed with live transactions");
  }
  group_commit_.reset();  // its thread first
}

// Transactions start without the engine mutex (the commit path holds it).
// committed_version_ is published only after its batch is applied, so a
// snapshot taken after reading it holds at least that version. A read-write
// transaction registers its read version under reads_mu_, which prune()
// also takes: history it needs is never pruned in between.
std::unique_ptr<Transaction> OccEngine::begin() {
  uint64_t v;
  {
    std::lock_guard lock(reads_mu_);
    v = committed_version_.load(std::memory_order_acquire);
    active_reads_.insert(v);
  }
  return std::make_unique<TxnImpl>(this, store_->snapshot(), v, false);
}

std::unique_ptr<ReadTransaction> OccEngine::beginRead() {
  uint64_t v = committed_version_.load(std::memory_order_acquire);
  return std::make_unique<TxnImpl>(this, store_->snapshot(), v, true);
}

void OccEngine::releaseRead(uint64_t read_version) {
  std::lock_guard lock(reads_mu_);
  auto it = active_reads_.find(read_version);
  CISTERN_CHECK(it != active_reads_.end(), "releasing an unknown read version");
  active_reads_.erase(it);
}

Status OccEngine::resolve(const TxnImpl& txn) const {
  if (txn.read_version_ < forgotten_version_) {
    return Status(ErrorCode::kTxnTooOld, "conflict history no longer covers the read version");
  }
  std::vector<KeyRange> touched = txn.reads_;
  std::vector<KeyRange> writes = txn.writeRanges(/*adds=*/false);
  touched.insert(touched.end(), writes.begin(), writes.end());
  normalizeRanges(&touched);
  for (auto h = history_.rbegin(); h != history_.rend() && h->version > txn.read_version_; ++h) {
    if (rangesIntersect(touched, h->writes)) {
      return Status(
          ErrorCode::kTxnConflict,
          fmt::format("conflicts with the transaction committed at version {}", h->version));
    }
  }
  return Status::OK();
}

void OccEngine::prune() {
  uint64_t oldest;
  {
    std::lock_guard reads(reads_mu_);
    oldest = active_reads_.empty() ? committed_version_.load() : *active_reads_.begin();
  }
  while (!history_.empty() && history_.front().version <= oldest) history_.pop_front();
  while (history_.size() > options_.conflict_history_max) {
    forgotten_version_ = history_.front().version;
    history_.pop_front();
  }
}

Status OccEngine::commit(TxnImpl& txn) {
  SteadyTime t0 = clock().now();
  Pending p{&txn};
  p.entry.item = &p;
  Status s = group_commit_->commit(p.entry);
  auto& m = KvMetrics::get();
  m.commit_us.observe(micros(t0, clock().now()));
  if (s.ok())
    m.commits.inc();
  else if (s.code() == ErrorCode::kTxnConflict)
    m.conflicts.inc();
  else if (s.code() == ErrorCode::kTxnTooOld)
    m.too_old.inc();
  return s;
}

// Turns every kAdd of a batch into a kSet of the resulting value. Runs on the
// batch being applied (or replayed), the only writer, so the store's current
// state plus the batch's earlier operations give each counter's value exactly.
Status foldAdds(const std::function<std::shared_ptr<StoreSnapshot>()>& snapshot, WriteBatch* ops) {
  bool any = false;
  for (const auto& op : *ops) any |= op.kind == WriteOp::kAdd;
  if (!any) return Status::OK();
  auto snap = snapshot();
  std::map<std::string, std::optional<std::string>, std::less<>> overlay;
  std::vector<KeyRange> cleared;
  for (auto& op : *ops) {
    switch (op.kind) {
      case WriteOp::kSet:
        overlay[op.key] = op.value;
        break;
      case WriteOp::kClear:
        overlay[op.key] = std::nullopt;
        break;
      case WriteOp::kClearRange:
        overlay.erase(overlay.lower_bound(op.key), overlay.lower_bound(op.value));
        cleared.push_back({op.key, op.value});
        break;
      case WriteOp::kAdd: {
        std::optional<std::string> current;
        bool in_cleared = false;
        for (const auto& r : cleared) in_cleared |= r.begin <= op.key && op.key < r.end;
        if (auto it = overlay.find(op.key); it != overlay.end()) {
          current = it->second;
        } else if (!in_cleared) {
          ASSIGN_OR_RETURN(current, snap->get(op.key));
        }
        int64_t value = (current ? decodeCounter(*current) : 0) + decodeCounter(op.value);
        op.kind = WriteOp::kSet;
        op.value = encodeCounter(value);
        overlay[op.key] = op.value;
        break;
      }
    }
  }
  return Status::OK();
}

// Stage 1: under the engine mutex, each transaction of the batch is
// checked against the history (a refused one is settled with its error) and
// the accepted ones get consecutive versions, their writes one batch; then,
// outside it, the batch is logged (durable when synced). A failed log write
// fails the engine.
Status OccEngine::formAndLog(const std::vector<GroupCommit::Entry*>& batch) {
  Batch b;
  size_t accepted = 0;
  {
    std::lock_guard lock(mu_);
    b.first = assigned_version_ + 1;
    for (GroupCommit::Entry* e : batch) {
      TxnImpl* txn = static_cast<Pending*>(e->item)->txn;
      Status s = failed_.ok() ? resolve(*txn) : failed_;
      if (!s.ok()) {
        e->status = std::move(s);
        e->settled = true;
        continue;
      }
      ++assigned_version_;
      history_.push_back({assigned_version_, txn->writeRanges(/*adds=*/true)});
      txn->appendOps(&b.ops);
      txn->commit_version_ = assigned_version_;
      ++accepted;
    }
    b.last = assigned_version_;
  }
  if (accepted == 0) return Status::OK();
  KvMetrics::get().batch_size.observe(accepted);
  SteadyTime t0 = clock().now();
  Status s = CISTERN_FAULT("kv.commit.before_apply");
  if (s.ok()) s = store_->log(b.ops, b.first, b.last, options_.sync_commits);
  KvMetrics::get().log_us.observe(micros(t0, clock().now()));
  std::lock_guard lock(mu_);
  if (!s.ok()) {
    setFailed(s);
    return failed_;
  }
  logged_.push_back(std::move(b));
  return Status::OK();
}

// Stage 2: the batches logged up to the newest version among `batch`
// (every batch that left stage 1 since the last stage 2, in version order),
// merged: their atomic adds folded, applied to the store, their last
// version published. Nothing is visible before it is durable.
Status OccEngine::applyLogged(const std::vector<GroupCommit::Entry*>& batch) {
  uint64_t last = 0;
  for (GroupCommit::Entry* e : batch)
    last = std::max(last, static_cast<Pending*>(e->item)->txn->commit_version_);
  WriteBatch ops;
  {
    std::lock_guard lock(mu_);
    if (!failed_.ok()) return failed_;
    while (!logged_.empty() && logged_.front().last <= last) {
      if (ops.empty()) {
        ops = std::move(logged_.front().ops);
      } else {
        auto& more = logged_.front().ops;
        ops.insert(ops.end(), std::make_move_iterator(more.begin()),
                   std::make_move_iterator(more.end()));
      }
      logged_.pop_front();
    }
  }
  SteadyTime t0 = clock().now();
  Status s = foldAdds([this] { return store_->snapshot(); }, &ops);
  if (s.ok()) s = store_->apply(ops, last, options_.sync_commits);
  KvMetrics::get().apply_us.observe(micros(t0, clock().now()));
  std::lock_guard lock(mu_);
  if (!s.ok()) {
    setFailed(s);
    return failed_;
  }
  // A batch durable and applied has committed, even if a later batch failed
  // the engine meanwhile.
  committed_version_.store(last, std::memory_order_release);
  prune();
  return Status::OK();
}

// The store may hold part of a batch or all of it; no later commit can be
// ordered after it safely, so the engine stops accepting writes.
void OccEngine::setFailed(const Status& s) {
  if (!failed_.ok()) return;
  CLOG_ERROR("kv", "{} engine failed committing a batch: {}", store_->name(), s.toString());
  failed_ = Status(ErrorCode::kIOError, fmt::format("kv engine failed: {}", s.toString()));
  store_->fail(failed_);
}

}  // namespace cistern::kv
