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

// ---------------------------------------------------------------------------
// OccEngine

// A committing thread's transaction, in the group commit.
struct OccEngine::Pending {
  BufferedTxn* txn;
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
  return std::make_unique<BufferedTxn>(this, store_->snapshot(), v, false);
}

std::unique_ptr<ReadTransaction> OccEngine::beginRead() {
  uint64_t v = committed_version_.load(std::memory_order_acquire);
  return std::make_unique<BufferedTxn>(this, store_->snapshot(), v, true);
}

void OccEngine::releaseRead(uint64_t read_version) {
  std::lock_guard lock(reads_mu_);
  auto it = active_reads_.find(read_version);
  CISTERN_CHECK(it != active_reads_.end(), "releasing an unknown read version");
  active_reads_.erase(it);
}

Status OccEngine::resolve(const BufferedTxn& txn) const {
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

Status OccEngine::commit(BufferedTxn& txn) {
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
  bool sync = options_.sync_commits && !store_->hasLog();
  {
    std::lock_guard lock(mu_);
    b.first = assigned_version_ + 1;
    for (GroupCommit::Entry* e : batch) {
      BufferedTxn* txn = static_cast<Pending*>(e->item)->txn;
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
      sync |= options_.sync_commits && txn->durability_ == Durability::kSynced;
      ++accepted;
    }
    b.last = assigned_version_;
  }
  if (accepted == 0) return Status::OK();
  KvMetrics::get().batch_size.observe(accepted);
  SteadyTime t0 = clock().now();
  Status s = CISTERN_FAULT("kv.commit.before_apply");
  if (s.ok()) s = store_->log(b.ops, b.first, b.last, sync);
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
    // A batch logged before the engine failed is durable: it is applied
    // (its versions come before the failed one's), unless an apply failed
    // and the store is in doubt.
    if (apply_failed_) return failed_;
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
    apply_failed_ = true;
    setFailed(s);
    return failed_;
  }
  // A batch durable and applied has committed, even if a later batch failed
  // the engine meanwhile.
  committed_version_.store(last, std::memory_order_release);
  prune();
  return Status::OK();
}

Status OccEngine::sync() {
  if (!options_.sync_commits) return Status::OK();
  Status s = store_->sync();
  if (!s.ok()) {
    std::lock_guard lock(mu_);
    setFailed(s);
    return failed_;
  }
  return s;
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
