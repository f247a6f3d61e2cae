#include "kv/occ_engine.h"

#include <fmt/format.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

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

namespace {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
              std::atomic<uint32_t>::is_always_lock_free);

// Sleeps while `*word` holds `expected` (returns early on any wake-up or signal).
void futexWait(std::atomic<uint32_t>* word, uint32_t expected) {
  (void)::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected,
                  nullptr, nullptr, 0);
}

// Wakes a thread sleeping on `word`. Only the address is used: the waiter
// may see its new value, return and free it before this runs; a wake-up at
// an address reused meanwhile is a spurious one for whoever sleeps there,
// which every futex user (glibc's locks, futexWait's callers) checks for.
void futexWake(const void* word) {
  (void)::syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

}  // namespace

// A committing thread's transaction, as the threads carrying its batch see it.
struct OccEngine::Pending {
  enum : uint32_t { kWaiting = 0, kApply = 1, kDone = 2, kSleeping = 4 /* a bit, with kWaiting */ };
  TxnImpl* txn;
  bool batched = false;  // in a batch that another thread carries
  // kDone once `status` is set, kApply once `apply` is; stored under mu_.
  // With the log writer the thread waits for a change without mu_ (a futex
  // on this word): woken, it need not queue for the engine mutex behind the
  // writer and the applier before it can return. It adds kSleeping before it
  // sleeps, and only then is a wake-up (a system call) sent.
  std::atomic<uint32_t> state{kWaiting};
  Status status;
  std::condition_variable cv;               // without the writer: done, or may lead
  std::unique_ptr<OccEngine::Batch> apply;  // logged by the writer; this thread applies it
  bool done() const { return state.load(std::memory_order_acquire) == kDone; }
  // Stores `s` (kApply or kDone) and wakes the thread if it sleeps. Once it
  // sees kDone the thread may return and free this: nothing of it is used
  // after the exchange but its address.
  void post(uint32_t s) {
    const void* word = &state;
    if (state.exchange(s, std::memory_order_acq_rel) & kSleeping) futexWake(word);
  }
};

void OccEngine::finish(Pending* p, Status status) {
  p->status = std::move(status);
  if (writer_.joinable()) {
    p->post(Pending::kDone);  // *p may be gone already
  } else {
    p->state.store(Pending::kDone, std::memory_order_release);
    p->cv.notify_one();  // its thread needs mu_ to return: *p is still there
  }
}

OccEngine::OccEngine(std::unique_ptr<Store> store, const EngineOptions& options)
    : store_(std::move(store)), options_(options) {
  committed_version_ = assigned_version_ = forgotten_version_ = store_->recoveredVersion();
  if (options_.commit_pipeline_depth == 0) options_.commit_pipeline_depth = 1;
  if (options_.sync_commits && options_.commit_pipeline_depth == 1 && store_->hasLog())
    writer_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "kv-log");  // for top -H and perf
      writerLoop();
    });
}

OccEngine::~OccEngine() {
  {
    std::lock_guard lock(mu_);
    std::lock_guard reads(reads_mu_);
    CISTERN_CHECK(active_reads_.empty(), "kv engine destroyed with live transactions");
    stop_ = true;
  }
  writer_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
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
  std::unique_lock lock(mu_);
  queue_.push_back(&p);
  if (writer_.joinable()) {
    if (writer_idle_ && !leading_ && queue_.size() == 1) {
      // The writer sleeps and nobody else is queued: carry the batch on this
      // thread, sparing two wake-ups (the writer's, then this thread's).
      leading_ = true;
      Batch b = formBatch();
      if (b.accepted.empty()) {
        leading_ = false;  // refused when resolved: nothing to log
      } else {
        logBatch(b, lock);
        leading_ = false;
        // Whoever queued meanwhile is the writer's (logged after this batch).
        if (!queue_.empty()) writer_cv_.notify_one();
        applyBatch(b, lock);
      }
    } else if (writer_idle_ && !leading_) {
      writer_cv_.notify_one();
    }
    lock.unlock();
    for (uint32_t st; (st = p.state.load(std::memory_order_acquire)) != Pending::kDone;) {
      if (st == Pending::kApply) {
        lock.lock();
        std::unique_ptr<Batch> b = std::move(p.apply);
        const uint64_t waited = micros(b->handed_at, clock().now());
        KvMetrics::get().handoff_us.observe(waited);
        handoff_avg_us_ += (static_cast<double>(waited) - handoff_avg_us_) / 8;
        applyBatch(*b, lock);  // finishes this transaction too
        lock.unlock();
        continue;
      }
      // Say so before sleeping; a change meanwhile makes the exchange fail.
      if (st == Pending::kWaiting &&
          !p.state.compare_exchange_weak(st, Pending::kWaiting | Pending::kSleeping,
                                         std::memory_order_acq_rel))
        continue;
      futexWait(&p.state, Pending::kWaiting | Pending::kSleeping);  // or a spurious wake-up
    }
  } else {
    while (!p.done()) {
      if (!p.batched && inflight_ < options_.commit_pipeline_depth) {
        // Lead: resolve everything queued into one batch and carry it through.
        Batch b = formBatch();
        if (!b.accepted.empty()) runBatch(b, lock);
      } else {
        p.cv.wait(lock);
      }
    }
    // Go on leading while others queued meanwhile and the pipeline has room:
    // each of them is spared a wake-up (a context switch costs more than a
    // small batch's whole commit here).
    while (!queue_.empty() && inflight_ < options_.commit_pipeline_depth) {
      Batch b = formBatch();
      if (!b.accepted.empty()) runBatch(b, lock);
    }
    lock.unlock();
  }
  auto& m = KvMetrics::get();
  m.commit_us.observe(micros(t0, clock().now()));
  if (p.status.ok())
    m.commits.inc();
  else if (p.status.code() == ErrorCode::kTxnConflict)
    m.conflicts.inc();
  else if (p.status.code() == ErrorCode::kTxnTooOld)
    m.too_old.inc();
  return p.status;
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

OccEngine::Batch OccEngine::formBatch() {
  std::deque<Pending*> queued;
  queued.swap(queue_);
  Batch b;
  b.first = assigned_version_ + 1;
  for (Pending* p : queued) {
    Status s = failed_.ok() ? resolve(*p->txn) : failed_;
    if (!s.ok()) {
      finish(p, std::move(s));
      continue;
    }
    ++assigned_version_;
    history_.push_back({assigned_version_, p->txn->writeRanges(/*adds=*/true)});
    p->txn->appendOps(&b.ops);
    p->txn->commit_version_ = assigned_version_;
    p->batched = true;
    b.accepted.push_back(p);
  }
  b.last = assigned_version_;
  if (!b.accepted.empty()) {
    ++inflight_;
    KvMetrics::get().batch_size.observe(b.accepted.size());
  }
  return b;
}

// Two stages. The log write runs concurrently with the batches before and
// after this one (up to commit_pipeline_depth of them), so one batch's sync
// overlaps the next one's; then the batch waits for its turn and is applied
// and published in version order. Nothing is visible before it is durable.
void OccEngine::runBatch(Batch& b, std::unique_lock<std::mutex>& lock) {
  logBatch(b, lock);
  applyBatch(b, lock);
}

// Writes the batch to the store's log (outside the mutex); a failure fails
// the engine.
void OccEngine::logBatch(const Batch& b, std::unique_lock<std::mutex>& lock) {
  lock.unlock();
  SteadyTime t0 = clock().now();
  Status s = CISTERN_FAULT("kv.commit.before_apply");
  if (s.ok()) s = store_->log(b.ops, b.first, b.last, options_.sync_commits);
  KvMetrics::get().log_us.observe(micros(t0, clock().now()));
  lock.lock();
  if (!s.ok()) setFailed(s);
}

// Waits for the batch's turn, applies and publishes it, and wakes its
// transactions.
void OccEngine::applyBatch(Batch& b, std::unique_lock<std::mutex>& lock) {
  Status s;
  bool applied = false;
  while (failed_.ok() && committed_version_ != b.first - 1) turn_cv_.wait(lock);
  if (failed_.ok()) {
    lock.unlock();
    SteadyTime t0 = clock().now();
    s = foldAdds([this] { return store_->snapshot(); }, &b.ops);
    if (s.ok()) s = store_->apply(b.ops, b.last, options_.sync_commits);
    const uint64_t took = micros(t0, clock().now());
    KvMetrics::get().apply_us.observe(took);
    lock.lock();
    apply_avg_us_ += (static_cast<double>(took) - apply_avg_us_) / 8;
    if (s.ok()) {
      committed_version_.store(b.last, std::memory_order_release);
      applied = true;
    } else {
      setFailed(s);
    }
  }
  // A batch durable and applied has committed, even if a later batch failed
  // the engine while this one was being applied.
  for (Pending* p : b.accepted) finish(p, applied ? Status::OK() : failed_);
  // The slot is held until the batch is applied: a batch formed while this
  // one applies would hold only the transactions that arrived meanwhile.
  --inflight_;
  prune();
  turn_cv_.notify_all();
}

void OccEngine::writerLoop() {
  std::unique_lock lock(mu_);
  while (true) {
    if (queue_.empty() || leading_) {  // a leader notifies when it is done logging
      if (stop_ && queue_.empty()) return;
      writer_idle_ = true;
      writer_cv_.wait(lock);
      continue;
    }
    writer_idle_ = false;
    auto b = std::make_unique<Batch>(formBatch());
    if (b->accepted.empty()) continue;
    logBatch(*b, lock);  // sync_commits holds for the writer
    if (queue_.empty() || applyOnWriter(b->accepted.size(), queue_.size())) {
      // Nothing waits to be logged (applying here costs the disk nothing),
      // or the wait is worth it: the batch is spared a hand-off.
      applyBatch(*b, lock);
      continue;
    }
    since_handoff_ = 0;
    Pending* applier = b->accepted.front();
    b->handed_at = clock().now();
    applier->apply = std::move(b);
    applier->post(Pending::kApply);  // it stays until it has applied the batch
  }
}

// Applying a batch on the writer holds up the log write of the `queued`
// transactions by an apply; handing it to a thread of its own `batch`
// transactions holds those up by that thread's wake-up, and lets the writer
// log the next batch meanwhile. The writer applies when the wake-ups would
// cost more than twice the applies (twice: an apply on the writer also
// delays every batch behind the queued one while the writer is the
// bottleneck). With idle cores a wake-up takes about as long as an apply
// (~50 µs each here); with both cores busy (a mount of `cistern up --mount`
// and 16 callers on 2 cores) 180–300 µs against 90–130 µs. Every 16th batch
// is handed off whatever the averages say, to measure the wake-up again.
bool OccEngine::applyOnWriter(size_t batch, size_t queued) {
  switch (options_.batch_applier) {
    case EngineOptions::BatchApplier::kWriter:
      return true;
    case EngineOptions::BatchApplier::kHandoff:
      return false;
    case EngineOptions::BatchApplier::kAuto:
      break;
  }
  if (++since_handoff_ >= 16) return false;
  return handoff_avg_us_ * static_cast<double>(batch) >
         2 * apply_avg_us_ * static_cast<double>(queued);
}

// The store may hold part of a batch or all of it; no later commit can be
// ordered after it safely, so the engine stops accepting writes.
void OccEngine::setFailed(const Status& s) {
  if (!failed_.ok()) return;
  CLOG_ERROR("kv", "{} engine failed committing a batch: {}", store_->name(), s.toString());
  failed_ = Status(ErrorCode::kIOError, fmt::format("kv engine failed: {}", s.toString()));
  store_->fail(failed_);
  turn_cv_.notify_all();
}

}  // namespace cistern::kv
