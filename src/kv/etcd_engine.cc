// The etcd engine (etcd_engine.h).
#include "kv/etcd_engine.h"

#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "common/fault.h"
#include "common/metrics.h"
#include "kv/buffered_txn.h"
#include "kv/etcd_client.h"

namespace cistern::kv {
namespace {

// Bumped by every commit that deletes (under the engine's prefix; keys from
// \xff\xff up are no transaction's).
constexpr std::string_view kDeletesKey = "\xff\xff/etcd/deletes";
// Commit markers: "<this>/<engine id>/<sequence>" (etcd_engine.h).
constexpr std::string_view kCommitsKey = "\xff\xff/etcd/commits/";
// A marker lives on a lease that is never renewed: a new one is granted
// every kMarkerLeaseEvery (by one committer, while the others go on with
// the current one), and a lease is used only while younger than
// kMarkerUsableFor, so every marker outlives its commit's settling
// (EtcdEngineOptions::resolve_ms, at most kResolveMax) with time to spare.
constexpr auto kMarkerLeaseEvery = std::chrono::seconds(10);
constexpr auto kMarkerUsableFor = std::chrono::seconds(30);
constexpr int64_t kMarkerTtlS = 60;
constexpr uint32_t kResolveMaxMs = 20000;
constexpr std::string_view kCommitted = "c", kFenced = "f";
constexpr int64_t kPage = 512;  // rows per range request of an iterator

bool inRanges(std::string_view key, const std::vector<KeyRange>& ranges) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), key,
                             [](std::string_view k, const KeyRange& r) { return k < r.begin; });
  return it != ranges.begin() && key < std::prev(it)->end;
}

class EtcdSnapshot;

// Rows of [begin, end) at the snapshot's revision, a page at a time.
class EtcdIterator final : public StoreIterator {
 public:
  EtcdIterator(EtcdSnapshot* snap, std::string_view begin, std::string_view end)
      : snap_(snap), begin_(begin), end_(end) {}
  void seek(std::string_view key) override {
    forward_ = true;
    load(std::max(std::string(key), begin_), end_);
  }
  void seekLast() override {
    forward_ = false;
    load(begin_, end_);
  }
  bool valid() const override { return status_.ok() && pos_ < page_.size(); }
  void next() override { advance(); }
  void prev() override { advance(); }
  std::string_view key() const override { return page_[pos_].key; }
  std::string_view value() const override { return page_[pos_].value; }
  Status status() const override { return status_; }

 private:
  void load(const std::string& from, const std::string& to);
  void advance() {
    if (++pos_ < page_.size() || !more_) return;
    const std::string last = page_.back().key;
    if (forward_)
      load(keyAfter(last), end_);
    else
      load(begin_, last);
  }

  EtcdSnapshot* const snap_;
  const std::string begin_, end_;
  bool forward_ = true;
  std::vector<etcd::KeyValue> page_;  // keys without the prefix
  size_t pos_ = 0;
  bool more_ = false;
  Status status_;
};

// The state of one etcd revision, as a transaction reads it; remembers the
// mod_revision of every key it returned (the commit's compares).
class EtcdSnapshot final : public StoreSnapshot {
 public:
  EtcdSnapshot(etcd::Client* client, const std::string* prefix, int64_t revision)
      : client_(client), prefix_(prefix), revision_(revision) {}

  Result<std::optional<std::string>> get(std::string_view key) override {
    etcd::RangeRequest r;
    r.key = *prefix_ + std::string(key);
    r.revision = revision_;
    ASSIGN_OR_RETURN(etcd::RangeResponse resp, client_->range(r));
    if (resp.kvs.empty()) return std::optional<std::string>();
    seen_[std::string(key)] = resp.kvs.front().mod_revision;
    return std::optional<std::string>(std::move(resp.kvs.front().value));
  }
  std::unique_ptr<StoreIterator> iterate(std::string_view begin, std::string_view end) override {
    return std::make_unique<EtcdIterator>(this, begin, end);
  }

  // Rows of [from, to) (descending when !forward), prefix stripped.
  Result<etcd::RangeResponse> fetch(const std::string& from, const std::string& to, bool forward) {
    etcd::RangeRequest r;
    r.key = *prefix_ + from;
    r.range_end = *prefix_ + to;
    r.revision = revision_;
    r.limit = kPage;
    r.descend = !forward;
    ASSIGN_OR_RETURN(etcd::RangeResponse resp, client_->range(r));
    for (auto& kv : resp.kvs) {
      if (!kv.key.starts_with(*prefix_))
        return Status(ErrorCode::kBadMessage, "etcd answered a key outside the range asked for");
      kv.key.erase(0, prefix_->size());
      seen_[kv.key] = kv.mod_revision;
    }
    return resp;
  }

  const std::map<std::string, int64_t, std::less<>>& seen() const { return seen_; }

 private:
  etcd::Client* const client_;
  const std::string* const prefix_;
  const int64_t revision_;
  std::map<std::string, int64_t, std::less<>> seen_;
};

void EtcdIterator::load(const std::string& from, const std::string& to) {
  page_.clear();
  pos_ = 0;
  more_ = false;
  if (from >= to) return;
  auto resp = snap_->fetch(from, to, forward_);
  if (!resp.ok()) {
    status_ = resp.status();
    return;
  }
  page_ = std::move(resp->kvs);
  more_ = resp->more;
}

}  // namespace

class EtcdEngine final : public Engine, public TxnHost {
 public:
  EtcdEngine(const EtcdEngineOptions& options, std::unique_ptr<etcd::Client> client)
      : options_(options), client_(std::move(client)) {
    std::random_device rd;
    id_ = fmt::format("{:08x}{:08x}", rd(), rd());
  }

  std::unique_ptr<Transaction> begin() override { return start(false); }
  std::unique_ptr<ReadTransaction> beginRead() override { return start(true); }
  std::string_view name() const override { return "etcd"; }

  const EngineOptions& options() const override { return options_.engine; }
  Clock& clock() override { return SystemClock::instance(); }
  void releaseRead(uint64_t) override {}
  Status commit(BufferedTxn& txn) override;

  // The cluster's current revision (a read of one key).
  Result<int64_t> currentRevision() {
    etcd::RangeRequest r;
    r.key = options_.prefix + std::string(kDeletesKey);
    r.keys_only = true;
    ASSIGN_OR_RETURN(etcd::RangeResponse resp, client_->range(r));
    return resp.revision;
  }

 private:
  std::unique_ptr<BufferedTxn> start(bool read_only);
  // The lease new commit markers go on (a new one every kMarkerLeaseEvery).
  Result<int64_t> markerLease();
  // A commit sent whose answer was lost (`unknown`): whether it committed,
  // settled by a fence on its marker. OK (and t's commit version) when it
  // did; kTxnConflict when it did not and now never will; `unknown` when
  // etcd answers no fence within options_.resolve_ms.
  Status resolve(BufferedTxn& t, const std::string& marker, int64_t lease, Status unknown);
  std::string full(std::string_view key) const { return options_.prefix + std::string(key); }
  Status tooLarge(const std::string& what) const { return Status(ErrorCode::kTxnTooLarge, what); }

  const EtcdEngineOptions options_;
  std::unique_ptr<etcd::Client> client_;
  std::string id_;  // this engine's, in its commit markers
  std::atomic<uint64_t> commits_{0};
  std::mutex lease_mu_;
  std::condition_variable lease_cv_;
  bool granting_ = false;
  int64_t lease_ = 0;
  std::chrono::steady_clock::time_point lease_at_{};
};

Result<int64_t> EtcdEngine::markerLease() {
  const auto now = std::chrono::steady_clock::now();
  std::unique_lock lock(lease_mu_);
  const bool usable = lease_ != 0 && now - lease_at_ < kMarkerUsableFor;
  if ((usable && now - lease_at_ < kMarkerLeaseEvery) || granting_) {
    if (usable) return lease_;
    lease_cv_.wait(lock, [&] { return !granting_; });
    if (lease_ != 0 && std::chrono::steady_clock::now() - lease_at_ < kMarkerUsableFor)
      return lease_;
    return Status(ErrorCode::kConnectionFailed, "etcd granted no lease for commit markers");
  }
  granting_ = true;
  lock.unlock();
  auto granted = client_->leaseGrant(kMarkerTtlS);
  lock.lock();
  granting_ = false;
  lease_cv_.notify_all();
  if (granted.ok()) {
    lease_ = *granted;
    lease_at_ = now;
    return lease_;
  }
  if (usable) return lease_;  // a new one next time
  // Nothing of the transaction was sent (a grant whose answer was lost
  // leaves at most a lease nobody uses, which expires).
  return Status(ErrorCode::kConnectionFailed, granted.status().message());
}

Status EtcdEngine::resolve(BufferedTxn& t, const std::string& marker, int64_t lease,
                           Status unknown) {
  auto count = [](const char* outcome) {
    metrics::Registry::global()
        .counter("kv_etcd_commits_resolved_total", {{"outcome", outcome}},
                 "commits whose answer was lost, by how a fence on their marker settled them")
        .inc();
  };
  // The commit compared the marker absent; a fence that puts it first makes
  // that compare fail for good. Failing, the fence reads who put it.
  etcd::TxnRequest fence;
  fence.compare.push_back({marker, {}, etcd::Compare::kVersion, etcd::Compare::kEqual, 0, {}});
  fence.success.push_back({etcd::Op::kPut, marker, std::string(kFenced), {}, lease, {}, nullptr});
  etcd::Op read{etcd::Op::kRange, {}, {}, {}, 0, {}, nullptr};
  read.range.key = marker;
  fence.failure.push_back(std::move(read));
  for (auto until = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(std::min(options_.resolve_ms, kResolveMaxMs));
       ;) {
    auto r = client_->txn(fence);
    if (r.ok()) {
      const bool fenced_now = r->succeeded;
      const auto* kvs = fenced_now || r->responses.empty() ? nullptr : &r->responses[0].range.kvs;
      if (!fenced_now && kvs && !kvs->empty() && kvs->front().value == kCommitted) {
        t.commit_version_ = static_cast<uint64_t>(kvs->front().mod_revision);
        count("committed");
        return Status::OK();
      }
      // Fenced now, or by an earlier fence whose own answer was lost.
      count("not_committed");
      return Status(ErrorCode::kTxnConflict,
                    fmt::format("etcd lost the answer to a commit ({}), which did not commit and "
                                "now never will: try the transaction again",
                                unknown.message()));
    }
    if (std::chrono::steady_clock::now() > until) {
      count("unknown");
      return unknown.withContext("no fence settled it in time");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// A transaction that cannot learn the revision fails at its first read
// (the snapshot then reads at revision 0 = never: kTxnTooOld is not right;
// it carries the connection error instead).
std::unique_ptr<BufferedTxn> EtcdEngine::start(bool read_only) {
  auto rev = currentRevision();
  int64_t r = rev.ok() ? *rev : 0;
  auto txn = std::make_unique<BufferedTxn>(
      this, std::make_shared<EtcdSnapshot>(client_.get(), &options_.prefix, r),
      static_cast<uint64_t>(r), read_only);
  if (!rev.ok()) txn->fail(rev.status());
  return txn;
}

Status EtcdEngine::commit(BufferedTxn& t) {
  const int64_t read_rev = static_cast<int64_t>(t.read_version_);
  auto* snap = static_cast<EtcdSnapshot*>(t.snap_.get());
  const uint32_t ops_max = options_.txn_ops_max;

  // What this transaction read or writes must be as it was at its read
  // revision (writes too: two writers of one key conflict, as in the OCC
  // engine); adds are the counters' own compares below.
  std::vector<KeyRange> reads = t.reads_;
  normalizeRanges(&reads);
  std::vector<KeyRange> touched = t.writeRanges(/*adds=*/false);
  touched.insert(touched.end(), reads.begin(), reads.end());
  normalizeRanges(&touched);
  std::vector<etcd::Compare> read_cmps;
  for (const KeyRange& r : touched)
    read_cmps.push_back(
        {full(r.begin), full(r.end), etcd::Compare::kMod, etcd::Compare::kLess, read_rev + 1, {}});
  std::vector<etcd::Compare> key_cmps;
  for (const auto& [key, mod] : snap->seen()) {
    if (inRanges(key, reads))
      key_cmps.push_back({full(key), {}, etcd::Compare::kMod, etcd::Compare::kEqual, mod, {}});
  }
  const size_t adds = t.adds_.size();
  // One more compare and one more put: the commit's marker.
  if (read_cmps.size() + adds + 2 > ops_max) {
    return tooLarge(
        fmt::format("a transaction on etcd reads and writes at most {} keys or ranges (etcd's "
                    "--max-txn-ops); this one {}",
                    ops_max - adds - 2, read_cmps.size()));
  }
  if (read_cmps.size() + key_cmps.size() + adds + 1 <= ops_max) {
    read_cmps.insert(read_cmps.end(), key_cmps.begin(), key_cmps.end());
  } else {
    // Too many keys to compare one by one: no delete at all since the read.
    read_cmps.push_back(
        {full(kDeletesKey), {}, etcd::Compare::kMod, etcd::Compare::kLess, read_rev + 1, {}});
  }

  // The writes: clears (around the keys it writes, which etcd may not see
  // both deleted and put in one Txn), then sets, deletes and counters.
  std::vector<etcd::Op> writes;
  bool deletes = false;
  for (const KeyRange& c : t.clears_) {
    std::string from = c.begin;
    auto punch = [&](const std::string& key) {
      if (key < from || key >= c.end) return;
      if (from < key)
        writes.push_back({etcd::Op::kDeleteRange, full(from), {}, full(key), 0, {}, nullptr});
      from = keyAfter(key);
    };
    std::vector<std::string> inside;
    for (auto it = t.writes_.lower_bound(c.begin); it != t.writes_.end() && it->first < c.end; ++it)
      inside.push_back(it->first);
    for (auto it = t.adds_.lower_bound(c.begin); it != t.adds_.end() && it->first < c.end; ++it)
      inside.push_back(it->first);
    std::sort(inside.begin(), inside.end());
    for (const std::string& k : inside) punch(k);
    if (from < c.end)
      writes.push_back({etcd::Op::kDeleteRange, full(from), {}, full(c.end), 0, {}, nullptr});
    deletes = true;
  }
  for (const auto& [key, value] : t.writes_) {
    if (value) {
      writes.push_back({etcd::Op::kPut, full(key), *value, {}, 0, {}, nullptr});
    } else {
      writes.push_back({etcd::Op::kDeleteRange, full(key), {}, {}, 0, {}, nullptr});
      deletes = true;
    }
  }
  if (deletes) writes.push_back({etcd::Op::kPut, full(kDeletesKey), {}, {}, 0, {}, nullptr});
  if (writes.size() + adds + 1 > ops_max) {
    return tooLarge(fmt::format(
        "a transaction on etcd writes at most {} keys or ranges (etcd's --max-txn-ops); this "
        "one writes {}",
        ops_max - 1, writes.size() + adds));
  }
  // Its marker: absent until it commits, then kCommitted; a lost answer is
  // settled by resolve().
  const std::string marker =
      full(fmt::format("{}{}/{}", kCommitsKey, id_, commits_.fetch_add(1) + 1));
  ASSIGN_OR_RETURN(const int64_t lease, markerLease());
  read_cmps.push_back({marker, {}, etcd::Compare::kVersion, etcd::Compare::kEqual, 0, {}});
  etcd::Op marker_read{etcd::Op::kRange, {}, {}, {}, 0, {}, nullptr};
  marker_read.range.key = marker;
  writes.push_back({etcd::Op::kPut, marker, std::string(kCommitted), {}, lease, {}, nullptr});

  // Counters: their current values, then a put of each sum under a compare
  // of its mod_revision; when only those compares fail, etcd's answer
  // carries the new values for the next try.
  struct Counter {
    std::string key;
    int64_t delta = 0;
    int64_t value = 0;
    int64_t mod = 0;
  };
  std::vector<Counter> counters;
  for (const auto& [key, delta] : t.adds_) counters.push_back({full(key), delta});
  auto readCounters = [&](const etcd::TxnResponse& resp) -> Status {
    if (resp.responses.size() != counters.size())
      return Status(ErrorCode::kBadMessage, "etcd answered a counter read with the wrong rows");
    for (size_t i = 0; i < counters.size(); ++i) {
      const auto& kvs = resp.responses[i].range.kvs;
      counters[i].value = kvs.empty() ? 0 : decodeCounter(kvs.front().value);
      counters[i].mod = kvs.empty() ? 0 : kvs.front().mod_revision;
    }
    return Status::OK();
  };
  std::shared_ptr<etcd::TxnRequest> counter_reads;
  if (!counters.empty()) {
    counter_reads = std::make_shared<etcd::TxnRequest>();
    counter_reads->compare = read_cmps;
    for (const Counter& c : counters) {
      etcd::Op op{etcd::Op::kRange, {}, {}, {}, 0, {}, nullptr};
      op.range.key = c.key;
      counter_reads->success.push_back(std::move(op));
    }
    etcd::TxnRequest now;
    now.success = counter_reads->success;
    ASSIGN_OR_RETURN(etcd::TxnResponse current, client_->txn(now));  // reads only
    RETURN_ON_ERROR(readCounters(current));
  }

  const uint32_t attempts = counters.empty() ? 1 : options_.add_attempts_max;
  for (uint32_t attempt = 0; attempt < attempts; ++attempt) {
    etcd::TxnRequest req;
    req.compare = read_cmps;
    req.success = writes;
    for (const Counter& c : counters) {
      req.compare.push_back({c.key, {}, etcd::Compare::kMod, etcd::Compare::kEqual, c.mod, {}});
      req.success.push_back(
          {etcd::Op::kPut, c.key, encodeCounter(c.value + c.delta), {}, 0, {}, nullptr});
    }
    // Failing, etcd answers with its marker (a send of this very request
    // that applied already: the client sends again after some refusals)
    // and with the counters' new values.
    req.failure.push_back(marker_read);
    if (counter_reads) req.failure.push_back({etcd::Op::kTxn, {}, {}, {}, 0, {}, counter_reads});
    if (uint64_t bytes = etcd::toJson(req).size(); bytes > options_.request_bytes_max) {
      return tooLarge(fmt::format(
          "a transaction on etcd sends at most {} bytes (etcd's --max-request-bytes); this one "
          "{}",
          options_.request_bytes_max, bytes));
    }
    // Faults for tests of resolve(): an answer lost before the request was
    // sent (it never commits), or after it committed.
    Result<etcd::TxnResponse> sent = Status(ErrorCode::kCommitUnknown, "not sent");
    if (Status unsent = CISTERN_FAULT("kv.etcd.commit.unsent_unknown"); !unsent.ok()) {
      sent = unsent;
    } else {
      sent = client_->txn(req);
      Status lost = CISTERN_FAULT("kv.etcd.commit.answer_lost");
      if (sent.ok() && !lost.ok()) sent = lost;
    }
    if (!sent.ok() && sent.status().code() == ErrorCode::kCommitUnknown)
      return resolve(t, marker, lease, sent.status());
    ASSIGN_OR_RETURN(etcd::TxnResponse resp, std::move(sent));
    if (resp.succeeded) {
      t.commit_version_ = static_cast<uint64_t>(resp.revision);
      return Status::OK();
    }
    if (resp.responses.empty())
      return Status(ErrorCode::kBadMessage, "etcd answered a failed commit without its marker");
    if (const auto& kvs = resp.responses[0].range.kvs;
        !kvs.empty() && kvs.front().value == kCommitted) {
      t.commit_version_ = static_cast<uint64_t>(kvs.front().mod_revision);
      return Status::OK();
    }
    const etcd::TxnResponse* nested =
        resp.responses.size() < 2 ? nullptr : resp.responses[1].txn.get();
    if (!nested || !nested->succeeded) break;  // what it read changed
    RETURN_ON_ERROR(readCounters(*nested));    // only its counters moved
  }
  return Status(ErrorCode::kTxnConflict,
                fmt::format("what the transaction read changed after etcd revision {}", read_rev));
}

Result<std::unique_ptr<Engine>> openEtcdEngine(const EtcdEngineOptions& options) {
  etcd::Client::Options co;
  co.endpoints = options.endpoints;
  co.timeout_ms = options.timeout_ms;
  ASSIGN_OR_RETURN(auto client, etcd::Client::create(co));
  auto engine = std::make_unique<EtcdEngine>(options, std::move(client));
  RETURN_ON_ERROR(engine->currentRevision().status());
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace cistern::kv
