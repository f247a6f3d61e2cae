// The simulated cluster (world.h). The storage node's steps follow
// storage_chains.cc function by function (headChange, onForward,
// applyAndForward, settle, settleDirty, resync) so that a reader can hold
// one beside the other; what the simulation leaves out is listed in
// docs/chain_protocol.md, "The simulation".
#include "tests/sim/world.h"

#include <fmt/format.h>

#include <cstdio>
#include <set>

#include "common/clock.h"
#include "common/log.h"
#include "common/random.h"
#include "kv/engine.h"
#include "mgmt.pb.h"
#include "mgmtd/cluster_manager.h"
#include "mgmtd/routing_table.h"
#include "storage/chain_table.h"
#include "storage/forward_rules.h"
#include "tests/sim/runtime.h"

namespace cistern::sim {
namespace {

using storage::ChainPosition;
using storage::ChunkStamp;
using storage::ForwardAction;
using storage::ForwardKind;

constexpr Micros kMs = 1000;
constexpr Micros kForwardTimeout = 1000 * kMs;
constexpr Micros kClientCallTimeout = 2000 * kMs;

// A node's own view of time: the simulation's plus the jumps it took.
class SimClock final : public Clock {
 public:
  explicit SimClock(Scheduler& s) : s_(s) {}
  SteadyTime now() const override {
    return SteadyTime(std::chrono::microseconds(s_.now() + offset_));
  }
  int64_t wallMicros() const override { return 1'700'000'000'000'000 + s_.now() + offset_; }
  void sleepFor(Duration) override { std::abort(); }  // nothing here sleeps on a clock
  void jump(Micros d) { offset_ += d; }

 private:
  Scheduler& s_;
  Micros offset_ = 0;
};

enum class Op { kRegister, kHeartbeat, kPushRouting, kWrite, kRead, kForward, kList };
enum class FwdOp { kChange, kReplace, kRemove, kSyncDone };

struct Msg {
  Op op = Op::kWrite;
  mgmt::RegisterNodeReq reg;
  mgmt::HeartbeatReq hb;
  mgmt::Routing routing;
  uint32_t chain = 0;
  uint64_t chain_version = 0;
  uint64_t chunk = 0;
  std::pair<uint64_t, uint64_t> update{0, 0};
  std::string data;
  FwdOp fop = FwdOp::kChange;
  ChunkStamp base, result;
  bool sync = false;
};

struct Reply {
  ErrorCode code = ErrorCode::kOk;
  std::string what;
  mgmt::RegisterNodeResp reg;
  mgmt::HeartbeatResp hb;
  bool exists = false;
  bool remembered = false;  // a retry of a change committed before: `stamp` is the chunk's now
  ChunkStamp stamp;
  std::string data;
  std::vector<std::pair<uint64_t, ChunkStamp>> list;
  Status status() const { return code == ErrorCode::kOk ? Status::OK() : Status(code, what); }
};
Reply err(const Status& s) { return Reply{s.code(), std::string(s.message())}; }
Reply err(ErrorCode c, std::string what) { return Reply{c, std::move(what)}; }

struct Copy {
  ChunkStamp stamp;
  uint32_t chain = 0;
  std::string data;
  bool operator==(const Copy&) const = default;
};

struct StorageNode : Actor {
  StorageNode(Scheduler& s, int i) : Actor(s), id(i), clock(s) { reset(); }
  void reset() {  // what a crash loses: memory and unsynced writes
    table = std::make_unique<storage::ChainTable>(clock);
    if (target) table->setTarget(target);
    current = durable;
    dirty.clear();
    updates.clear();
    update_order.clear();
    synced.clear();
    resyncing.clear();
  }
  int id;
  SimClock clock;
  uint32_t target = 0;
  uint32_t timeout_ms = 0;
  bool lost = false;             // gone for good
  bool failed = false;           // its disk failed: read-only, left out of beats
  bool failed_by_error = false;  // ... by a write error (restarted once the faults end)
  std::unique_ptr<storage::ChainTable> table;
  std::map<uint64_t, Copy> durable, current;
  std::map<uint64_t, uint32_t> dirty;  // chunk -> chain
  std::set<std::pair<uint64_t, uint64_t>> updates;
  std::deque<std::pair<uint64_t, uint64_t>> update_order;
  std::vector<std::pair<uint32_t, uint32_t>> synced;  // (chain, target) until a beat took it
  std::set<uint32_t> resyncing;                       // chains
};

struct MgmtdNode : Actor {
  explicit MgmtdNode(Scheduler& s) : Actor(s), clock(s) {}
  SimClock clock;
  std::unique_ptr<mgmtd::ClusterManager> manager;
  uint64_t pushed = 0;
};

struct ClientNode : Actor {
  ClientNode(Scheduler& s, int i) : Actor(s), id(i) {}
  int id;
  uint64_t seq = 0;
  mgmt::Routing routing;
  int in_flight = 0;
};

class World {
 public:
  World(uint64_t seed, const SimOptions& o) : o_(o), rng_(seed), mgmtd_(sched_) {
    kv_ = kv::openMemEngine();
    for (int i = 1; i <= o.storage_nodes; ++i)
      nodes_.push_back(std::make_unique<StorageNode>(sched_, i));
    for (int i = 0; i < o.clients; ++i)
      clients_.push_back(std::make_unique<ClientNode>(sched_, 100 + i));
  }
  ~World() {
    // Every coroutine unwinds: each actor crashes (and nothing restarts)
    // and the queue drains.
    stopping_ = true;
    mgmtd_.crash();
    for (auto& n : nodes_) n->crash();
    for (auto& c : clients_) c->crash();
    while (sched_.runOne()) {
    }
  }

  SimResult run();

 private:
  // ---- checkers ----
  void violate(const std::string& what) {
    if (!r_.ok) return;
    r_.ok = false;
    r_.violation = fmt::format("at {:.3f} s: {}", sched_.now() / 1e6, what);
  }
  void trace(const std::string& what) {
    if (o_.trace) std::fprintf(stderr, "%10.3f %s\n", sched_.now() / 1e6, what.c_str());
  }
  // A version of `chunk` seen (acknowledged, read, or held at the end).
  void noteSeen(uint64_t chunk, ChunkStamp s, const std::string& data, const char* how) {
    auto it = issued_.find(data);
    if (it == issued_.end() || it->second != chunk) {
      violate(
          fmt::format("{} of chunk {} returned bytes no client wrote there: {}", how, chunk, data));
      return;
    }
    auto [at, fresh] = seen_.try_emplace({chunk, s.version, s.chain_version}, data);
    if (!fresh && at->second != data)
      violate(fmt::format("chunk {} version {}.{} holds {} ({}) and {} (before)", chunk, s.version,
                          s.chain_version, data, how, at->second));
  }

  // ---- network ----
  Actor& actor(int id) {
    if (id == 0) return mgmtd_;
    if (id >= 100) return *clients_[static_cast<size_t>(id - 100)];
    return *nodes_[static_cast<size_t>(id - 1)];
  }
  bool linked(int a, int b) const { return !cut_.count(a) && !cut_.count(b); }
  Micros delay() {
    if (rng_.oneIn(50)) return static_cast<Micros>(rng_.uniform(200 * kMs));  // a slow one
    return 50 + static_cast<Micros>(rng_.uniform(static_cast<uint64_t>(max_delay_)));
  }
  bool lose() { return drop_per_mille_ > 0 && rng_.uniform(1000) < drop_per_mille_; }

  struct Pending {
    std::optional<Reply> reply;
    std::coroutine_handle<> waiter;
  };
  struct WaitReply {  // (a plain pointer: GCC 12 destroys a co_await temporary twice)
    Pending* p;
    bool await_ready() const noexcept { return p->reply.has_value(); }
    void await_suspend(std::coroutine_handle<> h) { p->waiter = h; }
    void await_resume() const {}
  };
  static void complete(Scheduler& s, const std::shared_ptr<Pending>& p, Reply r) {
    if (p->reply) return;  // answered, or timed out, already
    p->reply = std::move(r);
    if (auto w = std::exchange(p->waiter, {})) s.after(0, [w] { w.resume(); });
  }

  // (Lambdas are made in plain functions, not in coroutine bodies: GCC 12
  // miscompiles a coroutine local captured by copy.)
  // When a message sent now from `from` to `to` arrives: after a random
  // delay, but never before one sent earlier on that pair (the real
  // transport is one TCP connection per peer: in order, or lost with the
  // connection). Messages of different pairs overtake each other freely.
  Micros arrival(int from, int to) {
    Micros& last = last_arrival_[{from, to}];
    last = std::max(last, sched_.now() + delay());
    return last;
  }
  std::shared_ptr<Pending> send(int from, int to, const Msg& m, Micros timeout) {
    auto p = std::make_shared<Pending>();
    ++r_.messages;
    // Duplicates: a request delivered twice (an RPC layer's resend) — not
    // a forward down a chain, which no layer resends (a replica's change is
    // sent again only by the protocol itself, as a new message).
    const bool may_dup = m.op != Op::kForward;
    const int copies = may_dup && dup_per_mille_ > 0 && rng_.uniform(1000) < dup_per_mille_ ? 2 : 1;
    for (int i = 0; i < copies; ++i) {
      if (!linked(from, to) || lose()) continue;
      sched_.at(arrival(from, to), [this, from, to, m, p] { deliver(from, to, m, p); });
    }
    sched_.after(timeout,
                 [this, p] { complete(sched_, p, err(ErrorCode::kTimeout, "no answer in time")); });
    return p;
  }
  Task<Reply> call(int from, int to, Msg m, Micros timeout) {
    Actor& self = actor(from);
    const uint64_t inc = self.incarnation();
    std::shared_ptr<Pending> p = send(from, to, m, timeout);
    co_await WaitReply{p.get()};
    self.check(inc);
    co_return std::move(*p->reply);
  }
  void answer(int from, int to, const std::shared_ptr<Pending>& p, Reply r) {
    if (!linked(from, to) || lose()) return;
    sched_.at(arrival(to, from),
              [this, p, r = std::move(r)]() mutable { complete(sched_, p, std::move(r)); });
  }
  void deliver(int from, int to, const Msg& m, std::shared_ptr<Pending> p) {
    Actor& a = actor(to);
    if (!a.up() || !linked(from, to)) return;
    spawn(serve(from, to, m, std::move(p)));
  }
  Task<void> serve(int from, int to, Msg m, std::shared_ptr<Pending> p) {
    Reply r = co_await handle(to, std::move(m));
    answer(from, to, p, std::move(r));
  }
  Task<Reply> handle(int to, Msg m) {
    if (to == 0) co_return mgmtdHandle(m);
    StorageNode& n = *nodes_[static_cast<size_t>(to - 1)];
    switch (m.op) {
      case Op::kWrite:
        co_return co_await headChange(n, std::move(m));
      case Op::kRead:
        co_return co_await readChunk(n, m);
      case Op::kForward:
        co_return co_await onForward(n, std::move(m));
      case Op::kList: {
        Reply r;
        for (const auto& [chunk, c] : n.current)
          if (c.chain == m.chain) r.list.push_back({chunk, c.stamp});
        co_return r;
      }
      case Op::kPushRouting:
        if (Status s = n.table->update(m.routing); !s.ok()) co_return err(s);
        co_return Reply{};
      default:
        co_return err(ErrorCode::kInvalidArgument, "not a storage call");
    }
  }

  // ---- mgmtd ----
  mgmtd::ClusterManagerOptions managerOptions() const {
    mgmtd::ClusterManagerOptions mo;
    mo.heartbeat_timeout_ms = o_.heartbeat_timeout_ms;
    mo.replace_after_ms = o_.replace_after_ms;
    return mo;
  }
  void startMgmtd() {
    if (stopping_) return;
    mgmtd_.manager = std::make_unique<mgmtd::ClusterManager>(*kv_, mgmtd_.clock, managerOptions());
    mgmtd_.pushed = 0;
    mgmtd_.start();
    spawn(tickLoop());
  }
  Reply mgmtdHandle(const Msg& m) {
    if (m.op == Op::kRegister) {
      auto r = mgmtd_.manager->registerNode(m.reg);
      if (!r.ok()) return err(r.status());
      Reply out;
      out.reg = *r;
      return out;
    }
    if (m.op == Op::kHeartbeat) {
      auto r = mgmtd_.manager->heartbeat(m.hb);
      if (!r.ok()) return err(r.status());
      Reply out;
      out.hb = *r;
      return out;
    }
    return err(ErrorCode::kInvalidArgument, "not an mgmtd call");
  }
  Task<void> tickLoop() {
    for (;;) {
      co_await sleepFor(mgmtd_, 200 * kMs);
      auto v = mgmtd_.manager->tick();
      if (!v.ok()) {
        violate("mgmtd tick: " + v.status().toString());
        co_return;
      }
      if (*v <= mgmtd_.pushed) continue;
      mgmtd_.pushed = *v;
      auto routing = mgmtd::loadRouting(*kv_);
      if (!routing.ok()) continue;
      trace(fmt::format("mgmtd: routing v{}: {}", *v, routingText(*routing)));
      for (auto& n : nodes_) {
        Msg m;
        m.op = Op::kPushRouting;
        m.routing = *routing;
        spawn(pushTo(n->id, std::move(m)));
      }
    }
  }
  Task<void> pushTo(int node, Msg m) { (void)co_await call(0, node, std::move(m), 500 * kMs); }
  static std::string routingText(const mgmt::Routing& r) {
    std::string s;
    for (const auto& c : r.chains()) {
      s += fmt::format("[{} v{}:", c.id(), c.version());
      for (const auto& m : c.members())
        s += fmt::format(" {}{}", m.target(), "SYWOL"[std::min<int>(m.state(), 4)]);
      s += "] ";
    }
    return s;
  }

  // ---- storage: the steps of storage_chains.cc ----
  int nodeOfTarget(uint32_t target) const {
    auto it = node_of_target_.find(target);
    return it == node_of_target_.end() ? -1 : it->second;
  }
  Task<Status> applyLocal(StorageNode& n, uint64_t chunk, std::optional<Copy> copy, bool durable) {
    co_await sleepFor(n, 100 + static_cast<Micros>(rng_.uniform(2 * kMs)));
    if (n.failed || (disk_errors_ && rng_.oneIn(40)))
      co_return Status(ErrorCode::kIOError, fmt::format("node {}: disk write failed", n.id));
    if (o_.trace)
      trace(fmt::format(
          "node {}: chunk {} := {}{}", n.id, chunk,
          copy ? fmt::format("{}.{} {}", copy->stamp.version, copy->stamp.chain_version, copy->data)
               : std::string("removed"),
          durable ? "" : " (unsynced)"));
    if (copy) {
      n.current[chunk] = *copy;
      if (durable) n.durable[chunk] = *copy;
    } else {
      n.current.erase(chunk);
      if (durable) n.durable.erase(chunk);
    }
    co_return Status::OK();
  }
  Task<Status> forwardOnce(StorageNode& n, ChainPosition pos, Msg f) {
    f.op = Op::kForward;
    f.chain = pos.chain;
    f.chain_version = pos.version;
    const int to = nodeOfTarget(pos.successor);
    if (to < 0) co_return Status(ErrorCode::kNotFound, "successor unknown");
    Reply r = co_await call(n.id, to, std::move(f), kForwardTimeout);
    co_return r.status();
  }
  // This node's copy of `chunk` as a Forward (REPLACE, or REMOVE when none
  // or, with only_chain, of another chain).
  static Msg copyRequest(const StorageNode& n, uint64_t chunk, uint32_t only_chain) {
    Msg f;
    f.chunk = chunk;
    auto it = n.current.find(chunk);
    if (it != n.current.end() && (only_chain == 0 || it->second.chain == only_chain)) {
      f.fop = FwdOp::kReplace;
      f.result = it->second.stamp;
      f.data = it->second.data;
    } else {
      f.fop = FwdOp::kRemove;
    }
    return f;
  }
  Task<Status> replaceDownstream(StorageNode& n, ChainPosition pos, uint64_t chunk, bool sync) {
    Msg f = copyRequest(n, chunk, sync ? pos.chain : 0);
    f.sync = sync;
    co_return co_await forwardOnce(n, pos, std::move(f));
  }
  struct Outcome {
    Status applied, forwarded;
  };
  Task<Outcome> applyAndForward(StorageNode& n, ChainPosition pos, Msg f, bool apply,
                                std::optional<Copy> copy, bool durable) {
    Outcome out;
    if (pos.successor == 0 || f.sync) {
      if (apply) out.applied = co_await applyLocal(n, f.chunk, copy, durable);
      co_return out;
    }
    Future<Status> forwarded(n, forwardOnce(n, pos, f));
    if (apply) out.applied = co_await applyLocal(n, f.chunk, copy, durable);
    out.forwarded = co_await forwarded;
    if (out.forwarded.code() == ErrorCode::kChunkVersionMismatch && out.applied.ok())
      out.forwarded = co_await replaceDownstream(n, pos, f.chunk, false);
    co_return out;
  }
  Task<Status> settle(StorageNode& n, uint64_t chunk, ChainPosition pos) {
    if (pos.successor != 0) {
      Status s = co_await replaceDownstream(n, pos, chunk, false);
      if (!s.ok()) co_return s;
    }
    n.dirty.erase(chunk);
    co_return Status::OK();
  }
  Status stillAt(StorageNode& n, uint32_t chain, uint64_t version) {
    auto pos = n.table->position(chain);
    if (pos && pos->version == version) return Status::OK();
    return Status(ErrorCode::kStaleChainVersion, "the chain moved during the change");
  }
  void remember(StorageNode& n, std::pair<uint64_t, uint64_t> u) {
    if (n.updates.insert(u).second) n.update_order.push_back(u);
    while (n.update_order.size() > 4096) {
      n.updates.erase(n.update_order.front());
      n.update_order.pop_front();
    }
  }

  Task<Reply> headChange(StorageNode& n, Msg m) {
    auto first = n.table->serving(m.chain, m.chain_version);
    if (!first.ok()) co_return err(first.status());
    Guard guard = co_await lockChunk(n, m.chunk);
    auto pos = n.table->serving(m.chain, m.chain_version);
    if (!pos.ok()) co_return err(pos.status());
    if (n.failed && !o_.bug_head_takes_back)  // (holding the chunk, as storage_chains.cc)
      co_return err(ErrorCode::kIOError, "the target failed: it takes no changes");
    if (!pos->head) co_return err(ErrorCode::kNotServing, "not the head");
    if (n.dirty.count(m.chunk)) {
      Status s = co_await settle(n, m.chunk, *pos);
      if (!s.ok()) co_return err(s);
    }
    const bool has_update = m.update.first != 0;
    if (has_update && n.updates.count(m.update)) {
      Reply r;
      r.remembered = true;
      if (auto it = n.current.find(m.chunk); it != n.current.end()) r.stamp = it->second.stamp;
      co_return r;
    }
    Msg f;
    f.chunk = m.chunk;
    f.fop = FwdOp::kChange;
    auto before = n.current.find(m.chunk);
    if (before != n.current.end()) f.base = before->second.stamp;
    f.result = {f.base.version + 1, m.chain_version};
    f.update = m.update;
    f.data = m.data;
    n.dirty[m.chunk] = m.chain;
    const Copy copy{f.result, m.chain, m.data};
    if (o_.bug_ack_at_head && pos->successor != 0) {
      // BROKEN on purpose: answered once applied here, the forward left to
      // finish on its own.
      spawn(forwardAndForget(n, *pos, f));
      Status applied = co_await applyLocal(n, m.chunk, copy, true);
      if (!applied.ok()) co_return err(applied);
      if (has_update) remember(n, m.update);
      Reply r;
      r.stamp = f.result;
      co_return r;
    }
    Outcome out = co_await applyAndForward(n, *pos, f, true, copy, true);
    if (!out.applied.ok()) {
      const ErrorCode fe = out.forwarded.code();
      const bool downstream_may_have_it =
          pos->successor != 0 && fe != ErrorCode::kChunkVersionMismatch &&
          fe != ErrorCode::kStaleChainVersion && fe != ErrorCode::kNotServing;
      if (downstream_may_have_it && out.applied.code() == ErrorCode::kIOError &&
          !o_.bug_head_takes_back) {
        trace(fmt::format("node {}: its disk failed chunk {} the chain took: the target fails",
                          n.id, m.chunk));
        failByError(n);
        co_return err(out.applied);
      }
      if (pos->successor != 0 && out.forwarded.ok()) {
        if (Status back = co_await replaceDownstream(n, *pos, m.chunk, false); !back.ok())
          co_return err(out.applied);
      }
      n.dirty.erase(m.chunk);
      co_return err(out.applied);
    }
    if (has_update) remember(n, m.update);
    if (!out.forwarded.ok()) co_return err(out.forwarded);
    if (Status s = stillAt(n, m.chain, m.chain_version); !s.ok()) co_return err(s);
    n.dirty.erase(m.chunk);
    Reply r;
    r.stamp = f.result;
    co_return r;
  }
  Task<void> forwardAndForget(StorageNode& n, ChainPosition pos, Msg f) {
    Status s = co_await forwardOnce(n, pos, std::move(f));
    if (s.ok()) n.dirty.erase(f.chunk);
  }

  Task<Reply> onForward(StorageNode& n, Msg f) {
    auto pos = n.table->position(f.chain);
    if (!pos || !(pos->serving || pos->syncing))
      co_return err(ErrorCode::kNotServing, "takes no changes of the chain");
    if (pos->version != f.chain_version)
      co_return err(ErrorCode::kStaleChainVersion, "another chain version");
    if (f.fop == FwdOp::kSyncDone) {
      co_await sleepFor(n, 200 + static_cast<Micros>(rng_.uniform(kMs)));  // the engine's sync
      n.durable = n.current;
      const auto dirty = n.dirty;  // stale marks of the chain (storage_chains.cc)
      for (const auto& [chunk, chain] : dirty) {
        if (chain != f.chain) continue;
        Guard g = co_await lockChunk(n, chunk);
        n.dirty.erase(chunk);
      }
      n.synced.push_back({f.chain, n.target});
      spawn(beatOnce(n));  // reported at once
      co_return Reply{};
    }
    Guard guard = co_await lockChunk(n, f.chunk);
    pos = n.table->position(f.chain);
    if (!pos || !(pos->serving || pos->syncing) || pos->version != f.chain_version)
      co_return err(ErrorCode::kStaleChainVersion, "the chain moved");
    if (n.failed && !o_.bug_head_takes_back)
      co_return err(ErrorCode::kIOError, "the target failed: it takes no changes");
    auto have = n.current.find(f.chunk);
    const ChunkStamp* held = have == n.current.end() ? nullptr : &have->second.stamp;
    const ForwardKind kind = f.fop == FwdOp::kChange    ? ForwardKind::kChange
                             : f.fop == FwdOp::kReplace ? ForwardKind::kReplace
                                                        : ForwardKind::kRemove;
    const ForwardAction action = storage::classifyForward(kind, held, f.base, f.result);
    if (action == ForwardAction::kMismatch)
      co_return err(
          ErrorCode::kChunkVersionMismatch,
          fmt::format("holds {}.{}, the change applies to {}.{}", held ? held->version : 0,
                      held ? held->chain_version : 0, f.base.version, f.base.chain_version));
    n.dirty[f.chunk] = f.chain;
    std::optional<Copy> copy;
    if (f.fop != FwdOp::kRemove) copy = Copy{f.result, f.chain, f.data};
    Outcome out =
        co_await applyAndForward(n, *pos, f, action == ForwardAction::kApply, copy, !f.sync);
    if (!out.applied.ok()) {
      const ErrorCode fe = out.forwarded.code();
      if (pos->successor != 0 && !f.sync && out.applied.code() == ErrorCode::kIOError &&
          fe != ErrorCode::kChunkVersionMismatch && fe != ErrorCode::kStaleChainVersion &&
          fe != ErrorCode::kNotServing && !o_.bug_head_takes_back) {
        trace(fmt::format("node {}: its disk failed chunk {} the chain took: the target fails",
                          n.id, f.chunk));
        failByError(n);  // as at the head (storage_chains.cc onForward)
        co_return err(out.applied);
      }
      if (pos->successor == 0 || !out.forwarded.ok()) n.dirty.erase(f.chunk);
      co_return err(out.applied);
    }
    if (f.update.first != 0) remember(n, f.update);
    if (!out.forwarded.ok()) co_return err(out.forwarded);
    if (Status s = stillAt(n, f.chain, f.chain_version); !s.ok()) co_return err(s);
    n.dirty.erase(f.chunk);
    Reply r;
    if (copy) r.stamp = copy->stamp;
    co_return r;
  }

  Task<Reply> readChunk(StorageNode& n, const Msg& m) {
    auto pos = n.table->serving(m.chain, m.chain_version);
    if (!pos.ok()) co_return err(pos.status());
    if (!o_.bug_read_dirty && n.dirty.count(m.chunk))
      co_return err(ErrorCode::kChunkNotCommitted, "a change is in flight");
    Reply r;
    if (auto it = n.current.find(m.chunk); it != n.current.end()) {
      r.exists = true;
      r.stamp = it->second.stamp;
      r.data = it->second.data;
    }
    co_await sleepFor(n, 50 + static_cast<Micros>(rng_.uniform(kMs)));
    if (!o_.bug_read_dirty && n.dirty.count(m.chunk))
      co_return err(ErrorCode::kChunkNotCommitted, "a change came in during the read");
    co_return r;
  }

  Task<Status> sendCopy(StorageNode& n, ChainPosition p, uint64_t chunk, bool sync) {
    Msg f = copyRequest(n, chunk, sync ? p.chain : 0);
    f.sync = sync;
    co_return co_await forwardOnce(n, p, std::move(f));
  }
  Task<void> settleDirty(StorageNode& n) {
    if (n.failed && !o_.bug_head_takes_back) co_return;  // (storage_chains.cc)
    const auto dirty = n.dirty;
    for (const auto& [chunk, chain] : dirty) {
      auto pos = n.table->position(chain);
      if (!pos || !pos->head) continue;
      Guard guard = co_await lockChunk(n, chunk);
      if (n.failed && !o_.bug_head_takes_back) co_return;  // failed meanwhile
      if (!n.dirty.count(chunk)) continue;
      pos = n.table->position(chain);
      if (!pos || !pos->head) continue;
      if (pos->successor != 0) {
        Status s = co_await sendCopy(n, *pos, chunk, false);
        trace(fmt::format("node {}: settling chunk {}: {}", n.id, chunk, s.toString()));
        if (!s.ok()) continue;
      }
      n.dirty.erase(chunk);
    }
  }
  Task<Status> resync(StorageNode& n, ChainPosition p) {
    if (n.failed && !o_.bug_head_takes_back)
      co_return Status(ErrorCode::kIOError, "the target failed: it syncs no successor");
    std::map<uint64_t, ChunkStamp> mine, theirs;
    for (const auto& [chunk, c] : n.current)
      if (c.chain == p.chain) mine[chunk] = c.stamp;
    const int to = nodeOfTarget(p.successor);
    if (to < 0) co_return Status(ErrorCode::kNotFound, "successor unknown");
    Msg list;
    list.op = Op::kList;
    list.chain = p.chain;
    Reply r = co_await call(n.id, to, list, kForwardTimeout);
    if (!r.status().ok()) co_return r.status();
    for (const auto& [chunk, s] : r.list) theirs[chunk] = s;
    std::set<uint64_t> differ;
    for (const auto& [chunk, s] : mine) {
      auto it = theirs.find(chunk);
      if (it == theirs.end() || !(it->second == s)) differ.insert(chunk);
    }
    for (const auto& [chunk, s] : theirs)
      if (!mine.count(chunk)) differ.insert(chunk);
    for (uint64_t chunk : differ) {
      Guard guard = co_await lockChunk(n, chunk);
      if (n.failed && !o_.bug_head_takes_back)
        co_return Status(ErrorCode::kIOError, "the target failed: it syncs no successor");
      Status s = co_await sendCopy(n, p, chunk, true);
      if (!s.ok()) co_return s;
    }
    Msg done;
    done.fop = FwdOp::kSyncDone;
    co_return co_await forwardOnce(n, p, std::move(done));
  }
  Task<void> resyncTask(StorageNode& n, ChainPosition p) {
    Status s = co_await resync(n, p);
    trace(fmt::format("node {}: resync of chain {} v{} into target {}: {}", n.id, p.chain,
                      p.version, p.successor, s.toString()));
    if (!s.ok()) co_await sleepFor(n, 200 * kMs);  // then started again
    n.resyncing.erase(p.chain);
  }
  Task<void> syncLoop(StorageNode& n) {
    Micros next_settle = 0;
    for (;;) {
      co_await sleepFor(n, 100 * kMs);
      if (sched_.now() >= next_settle) {
        next_settle = sched_.now() + 500 * kMs;
        co_await settleDirty(n);
      }
      for (const auto& p : n.table->syncsToRun()) {
        if (!n.resyncing.insert(p.chain).second) continue;
        spawn(resyncTask(n, p));
      }
    }
  }
  Task<Status> registerNode(StorageNode& n) {
    Msg m;
    m.op = Op::kRegister;
    m.reg.set_name(fmt::format("node{}", n.id));
    m.reg.set_endpoint(fmt::format("sim{}:1", n.id));
    m.reg.add_target_paths("/t");
    Reply r = co_await call(n.id, 0, std::move(m), 1000 * kMs);
    if (!r.status().ok()) co_return r.status();
    if (r.reg.target_ids_size() != 1) co_return Status(ErrorCode::kInternal, "no target id");
    n.target = r.reg.target_ids(0);
    n.timeout_ms = r.reg.heartbeat_timeout_ms();
    n.table->registered(n.target, r.reg.routing_version());
    node_of_target_[n.target] = n.id;
    co_return Status::OK();
  }
  static void dropReported(StorageNode& n, const std::vector<std::pair<uint32_t, uint32_t>>& sent) {
    std::erase_if(n.synced, [&](const auto& s) {
      return std::find(sent.begin(), sent.end(), s) != sent.end();
    });
  }
  Task<void> beatOnce(StorageNode& n) {
    Msg m;
    m.op = Op::kHeartbeat;
    m.hb.set_name(fmt::format("node{}", n.id));
    if (!n.failed) m.hb.add_alive_targets(n.target);
    const auto sent_synced = n.synced;
    for (auto [chain, t] : sent_synced) {
      auto* s = m.hb.add_synced();
      s->set_chain(chain);
      s->set_target(t);
    }
    m.hb.set_routing_version(n.table->routingVersion());
    const SteadyTime sent = n.clock.now();
    Reply r = co_await call(n.id, 0, std::move(m), 1000 * kMs);
    if (r.code == ErrorCode::kNotFound) {
      (void)co_await registerNode(n);
      co_return;
    }
    if (!r.status().ok()) co_return;
    dropReported(n, sent_synced);
    if (r.hb.has_routing()) {
      if (Status s = n.table->update(r.hb.routing()); !s.ok())
        violate("routing from mgmtd: " + s.toString());
    }
    n.table->renewLease(sent, n.timeout_ms);
  }
  Task<void> beatLoop(StorageNode& n) {
    for (;;) {  // (a co_await in a loop's condition miscompiles in GCC 12)
      Status s = co_await registerNode(n);
      if (s.ok()) break;
      co_await sleepFor(n, 500 * kMs);
    }
    for (;;) {
      co_await beatOnce(n);
      co_await sleepFor(n, std::max<Micros>(n.timeout_ms / 5, 10) * kMs);
    }
  }
  void startNode(StorageNode& n) {
    if (stopping_) return;
    n.start();
    spawn(beatLoop(n));
    spawn(syncLoop(n));
  }

  // ---- clients ----
  Task<void> refresh(ClientNode& c) {
    co_await sleepFor(c, kMs);
    if (auto r = mgmtd::loadRouting(*kv_); r.ok()) c.routing = *r;
  }
  const mgmt::Chain* chainOf(const ClientNode& c, uint64_t chunk) const {
    const uint32_t id = static_cast<uint32_t>(chunk % static_cast<uint64_t>(o_.chains)) + 1;
    for (const auto& ch : c.routing.chains())
      if (ch.id() == id) return &ch;
    return nullptr;
  }
  static Msg chunkRequest(Op op, const mgmt::Chain& chain, uint64_t chunk) {
    Msg m;
    m.op = op;
    m.chain = chain.id();
    m.chain_version = chain.version();
    m.chunk = chunk;
    return m;
  }
  Task<void> clientWrite(ClientNode& c, uint64_t chunk) {
    const std::pair<uint64_t, uint64_t> update{static_cast<uint64_t>(c.id), ++c.seq};
    const std::string value = fmt::format("c{}.{}", c.id, c.seq);
    issued_[value] = chunk;
    const Micros deadline = sched_.now() + 20000 * kMs;
    for (;;) {
      const mgmt::Chain* chain = chainOf(c, chunk);
      if (chain && chain->targets_size() > 0) {
        Msg m = chunkRequest(Op::kWrite, *chain, chunk);
        m.update = update;
        m.data = value;
        const int head = nodeOfTarget(chain->targets(0));
        if (head < 0) {
          violate(fmt::format("chain {} names target {}, which never registered", chain->id(),
                              chain->targets(0)));
          co_return;
        }
        Reply r = co_await call(c.id, head, std::move(m), kClientCallTimeout);
        if (r.code != ErrorCode::kOk)
          trace(fmt::format("client {}: chunk {} := {} at node {}: {}", c.id, chunk, value, head,
                            r.status().toString()));
        if (r.code == ErrorCode::kOk) {
          ++r_.writes_acked;
          trace(fmt::format("client {}: chunk {} := {} acked as {}.{}", c.id, chunk, value,
                            r.stamp.version, r.stamp.chain_version));
          // A retry answered from memory carries the chunk's version now,
          // not its own (unknown: only that it committed).
          if (r.remembered) co_return;
          noteSeen(chunk, r.stamp, value, "an acknowledged write");
          auto& hw = hw_[chunk];
          hw = std::max(hw, r.stamp.version);
          co_return;
        }
      }
      if (sched_.now() > deadline) {
        ++r_.writes_unknown;
        trace(fmt::format("client {}: chunk {} := {} given up", c.id, chunk, value));
        co_return;
      }
      co_await sleepFor(c, 20 * kMs + static_cast<Micros>(rng_.uniform(180 * kMs)));
      co_await refresh(c);
    }
  }
  Task<void> clientRead(ClientNode& c, uint64_t chunk) {
    const uint64_t floor = hw_[chunk];  // what completed before this read began
    const Micros began = sched_.now();
    const Micros deadline = sched_.now() + 20000 * kMs;
    for (;;) {
      const mgmt::Chain* chain = chainOf(c, chunk);
      if (chain && chain->targets_size() > 0) {
        const Msg m = chunkRequest(Op::kRead, *chain, chunk);
        const int n = chain->targets_size();
        const uint32_t first =
            chain->targets(static_cast<int>(rng_.uniform(static_cast<uint64_t>(n))));
        const uint32_t tail = chain->targets(n - 1);
        int at = nodeOfTarget(first);
        Reply r = co_await call(c.id, at, m, kClientCallTimeout);
        if (r.code == ErrorCode::kChunkNotCommitted) {
          at = nodeOfTarget(tail);
          r = co_await call(c.id, at, m, kClientCallTimeout);
        }
        if (r.code == ErrorCode::kOk) {
          ++r_.reads_checked;
          trace(
              fmt::format("client {}: read chunk {} (began at {:.3f}, floor {}) at node {}: "
                          "{}.{} {}",
                          c.id, chunk, began / 1e6, floor, at, r.stamp.version,
                          r.stamp.chain_version, r.exists ? r.data : "none"));
          if (!r.exists) {
            if (floor > 0)
              violate(
                  fmt::format("a read of chunk {} found none; version {} was acknowledged "
                              "or read before it began",
                              chunk, floor));
            co_return;
          }
          if (r.stamp.version < floor)
            violate(
                fmt::format("a stale read of chunk {}: version {}.{} ({}), but version {} "
                            "was acknowledged or read before it began",
                            chunk, r.stamp.version, r.stamp.chain_version, r.data, floor));
          noteSeen(chunk, r.stamp, r.data, "a read");
          auto& hw = hw_[chunk];
          hw = std::max(hw, r.stamp.version);
          co_return;
        }
      }
      if (sched_.now() > deadline) co_return;
      co_await sleepFor(c, 20 * kMs + static_cast<Micros>(rng_.uniform(180 * kMs)));
      co_await refresh(c);
    }
  }
  Task<void> clientLoop(ClientNode& c) {
    co_await refresh(c);
    while (sched_.now() < workload_end_) {
      const uint64_t chunk = rng_.uniform(static_cast<uint64_t>(o_.chunks));
      ++c.in_flight;
      if (rng_.uniform(10) < 6) {
        co_await clientWrite(c, chunk);
      } else {
        co_await clientRead(c, chunk);
      }
      --c.in_flight;
      co_await sleepFor(c, 2 * kMs + static_cast<Micros>(rng_.uniform(40 * kMs)));
    }
  }

  // ---- faults ----
  void scheduleFaults();
  // A write error failed the node's target (read-only, left out of its
  // beats). Its disk is replaced when the faults end (at once if they have:
  // an apply that failed during them may be found only after).
  void failByError(StorageNode& n) {
    n.failed = true;
    n.failed_by_error = true;
    if (faults_over_) sched_.after(100 * kMs, [this, &n] { replaceDisk(n); });
  }
  // The operator replaced the disk: the node restarts with what it held.
  void replaceDisk(StorageNode& n) {
    if (!n.failed_by_error) return;
    trace(fmt::format("node {} restarts with a working disk", n.id));
    n.crash();
    n.reset();
    n.failed = n.failed_by_error = false;
    startNode(n);
  }
  void crashNode(StorageNode& n, Micros down_for, bool for_good) {
    if (!n.up() || n.lost || n.failed) return;
    ++r_.crashes;
    if (o_.trace) {
      std::string lost;
      for (const auto& [chunk, c] : n.current) {
        auto d = n.durable.find(chunk);
        if (d == n.durable.end() || !(d->second == c))
          lost += fmt::format(
              " chunk {} {}.{} -> {}", chunk, c.stamp.version, c.stamp.chain_version,
              d == n.durable.end()
                  ? std::string("none")
                  : fmt::format("{}.{}", d->second.stamp.version, d->second.stamp.chain_version));
      }
      trace(fmt::format("node {} (target {}) crashes{};{}", n.id, n.target,
                        for_good ? " for good" : "", lost.empty() ? " nothing unsynced" : lost));
    }
    n.crash();
    n.reset();
    if (for_good) {
      n.lost = true;
      ++r_.lost_nodes;
      return;
    }
    sched_.after(down_for, [this, &n] {
      if (n.lost || n.up()) return;
      trace(fmt::format("node {} restarts", n.id));
      startNode(n);
    });
  }
  // At most one node is gone for good in a run (more can take every
  // up-to-date replica of a chain: then it rightly waits forever).
  bool mayLoseOneMore() const {
    return r_.lost_nodes == 0 &&
           1 + static_cast<uint64_t>(o_.replication) <= static_cast<uint64_t>(o_.storage_nodes);
  }

  // ---- the end ----
  // Empty when converged; else what is still off.
  std::string convergence() {
    auto routing = mgmtd::loadRouting(*kv_);
    if (!routing.ok()) return "no routing";
    for (auto& c : clients_)
      if (c->in_flight) return fmt::format("client {} has an operation in flight", c->id);
    waiting_for_gone_.clear();
    for (const auto& chain : routing->chains()) {
      // A chain whose last holder of the newest data (LASTSRV) is gone for
      // good waits for it, rightly: nothing else has what it acknowledged.
      // Its data is unavailable, not lost; the checks skip it.
      if (chain.targets_size() == 0) {
        for (const auto& m : chain.members()) {
          if (m.state() != mgmt::LASTSRV) continue;
          const StorageNode& n = *nodes_[static_cast<size_t>(nodeOfTarget(m.target()) - 1)];
          if (n.lost || n.failed) waiting_for_gone_.insert(chain.id());
        }
        if (waiting_for_gone_.count(chain.id())) continue;
      }
      if (chain.targets_size() != o_.replication)
        return fmt::format("chain {} has {} SERVING of {}: {}", chain.id(), chain.targets_size(),
                           o_.replication, routingText(*routing));
      for (uint32_t t : chain.targets()) {
        const StorageNode& n = *nodes_[static_cast<size_t>(nodeOfTarget(t) - 1)];
        if (n.lost || n.failed)
          return fmt::format("chain {} serves from node {}, which is gone", chain.id(), n.id);
      }
    }
    for (uint64_t chunk = 0; chunk < static_cast<uint64_t>(o_.chunks); ++chunk) {
      const uint32_t id = static_cast<uint32_t>(chunk % static_cast<uint64_t>(o_.chains)) + 1;
      const mgmt::Chain* chain = nullptr;
      for (const auto& ch : routing->chains())
        if (ch.id() == id) chain = &ch;
      if (!chain) return fmt::format("no chain {}", id);
      if (waiting_for_gone_.count(id)) continue;
      std::optional<Copy> first;
      for (int i = 0; i < chain->targets_size(); ++i) {
        const StorageNode& n = *nodes_[static_cast<size_t>(nodeOfTarget(chain->targets(i)) - 1)];
        if (n.dirty.count(chunk)) return fmt::format("chunk {} dirty on node {}", chunk, n.id);
        auto it = n.current.find(chunk);
        const Copy got = it == n.current.end() ? Copy{} : it->second;
        if (i == 0) {
          first = got;
        } else if (!(got == *first)) {
          return fmt::format("chunk {}: node {} holds {}.{} ({}), the head {}.{} ({})", chunk, n.id,
                             got.stamp.version, got.stamp.chain_version, got.data,
                             first->stamp.version, first->stamp.chain_version, first->data);
        }
      }
    }
    return {};
  }
  void finalChecks() {
    auto routing = mgmtd::loadRouting(*kv_);
    for (uint64_t chunk = 0; chunk < static_cast<uint64_t>(o_.chunks); ++chunk) {
      const uint32_t id = static_cast<uint32_t>(chunk % static_cast<uint64_t>(o_.chains)) + 1;
      for (const auto& ch : routing->chains()) {
        if (ch.id() != id || waiting_for_gone_.count(id)) continue;
        const StorageNode& n = *nodes_[static_cast<size_t>(nodeOfTarget(ch.targets(0)) - 1)];
        auto it = n.current.find(chunk);
        const uint64_t have = it == n.current.end() ? 0 : it->second.stamp.version;
        if (have < hw_[chunk])
          violate(
              fmt::format("chunk {} ends at version {}; version {} was acknowledged or "
                          "read (an acknowledged write lost)",
                          chunk, have, hw_[chunk]));
        if (it != n.current.end()) noteSeen(chunk, it->second.stamp, it->second.data, "the end");
      }
    }
  }

  const SimOptions o_;
  Xoshiro256 rng_;
  Scheduler sched_;
  std::unique_ptr<kv::Engine> kv_;
  MgmtdNode mgmtd_;
  std::vector<std::unique_ptr<StorageNode>> nodes_;
  std::vector<std::unique_ptr<ClientNode>> clients_;
  std::map<uint32_t, int> node_of_target_;
  std::set<int> cut_;                                   // nodes cut off from everyone
  std::map<std::pair<int, int>, Micros> last_arrival_;  // (from, to) -> its last arrival
  std::set<uint32_t> waiting_for_gone_;  // chains whose LASTSRV member is gone for good
  uint64_t drop_per_mille_ = 0, dup_per_mille_ = 0;
  Micros max_delay_ = 2 * kMs;
  bool disk_errors_ = false;
  bool stopping_ = false;
  bool faults_over_ = false;
  Micros workload_end_ = 0;
  SimResult r_;
  // Checker state.
  std::map<std::string, uint64_t> issued_;  // value -> its chunk
  std::map<std::tuple<uint64_t, uint64_t, uint64_t>, std::string> seen_;
  std::map<uint64_t, uint64_t> hw_;  // chunk -> newest version acknowledged or read
};

void World::scheduleFaults() {
  const Micros end = o_.fault_ms * kMs;
  // The network's mood for the whole fault phase.
  drop_per_mille_ = rng_.uniform(60);
  dup_per_mille_ = rng_.uniform(40);
  max_delay_ = (1 + static_cast<Micros>(rng_.uniform(20))) * kMs;
  const int faults = 3 + static_cast<int>(rng_.uniform(10));
  for (int i = 0; i < faults; ++i) {
    const Micros at =
        1000 * kMs + static_cast<Micros>(rng_.uniform(static_cast<uint64_t>(end - 1000 * kMs)));
    const uint64_t kind = rng_.uniform(100);
    const int node = 1 + static_cast<int>(rng_.uniform(static_cast<uint64_t>(o_.storage_nodes)));
    const Micros span = 200 * kMs + static_cast<Micros>(rng_.uniform(4000 * kMs));
    if (kind < 35) {  // a crash and a restart
      sched_.at(at, [this, node, span] {
        crashNode(*nodes_[static_cast<size_t>(node - 1)], span, false);
      });
    } else if (kind < 45) {  // lost for good, or its disk failed for good
      const bool disk = rng_.oneIn(2);
      sched_.at(at, [this, node, disk] {
        StorageNode& n = *nodes_[static_cast<size_t>(node - 1)];
        if (!mayLoseOneMore() || n.lost || n.failed || !n.up()) return;
        if (disk) {
          trace(fmt::format("node {}: its disk fails for good", node));
          n.failed = true;
          ++r_.lost_nodes;
        } else {
          crashNode(n, 0, true);
        }
      });
    } else if (kind < 65) {  // a storage node cut off
      sched_.at(at, [this, node, span] {
        ++r_.partitions;
        trace(fmt::format("node {} cut off", node));
        cut_.insert(node);
        sched_.after(span, [this, node] {
          trace(fmt::format("node {} reconnected", node));
          cut_.erase(node);
        });
      });
    } else if (kind < 75) {  // mgmtd cut off, or crashed (a new primary takes over)
      const bool crash = rng_.oneIn(2);
      sched_.at(at, [this, span, crash] {
        if (crash) {
          if (!mgmtd_.up()) return;
          ++r_.mgmtd_crashes;
          trace("mgmtd crashes");
          mgmtd_.crash();
          mgmtd_.manager.reset();
          sched_.after(span / 2, [this] {
            if (mgmtd_.up()) return;  // the end of the faults restarted it
            trace("mgmtd restarts");
            startMgmtd();
          });
        } else {
          ++r_.partitions;
          trace("mgmtd cut off");
          cut_.insert(0);
          sched_.after(span / 2, [this] { cut_.erase(0); });
        }
      });
    } else if (kind < 85) {  // disk writes fail now and then
      sched_.at(at, [this, span] {
        trace(fmt::format("disk writes fail now and then for {} ms", span / kMs));
        disk_errors_ = true;
        sched_.after(span, [this] { disk_errors_ = false; });
      });
    } else {  // a clock jumps forward: a storage node's (any size), mgmtd's (small)
      const bool on_mgmtd = rng_.oneIn(3);
      const Micros jump = on_mgmtd
                              ? static_cast<Micros>(rng_.uniform(o_.heartbeat_timeout_ms / 8)) * kMs
                              : static_cast<Micros>(rng_.uniform(3000)) * kMs;
      sched_.at(at, [this, node, on_mgmtd, jump] {
        trace(fmt::format("{}'s clock jumps {} ms",
                          on_mgmtd ? std::string("mgmtd") : fmt::format("node {}", node),
                          jump / kMs));
        if (on_mgmtd) {
          mgmtd_.clock.jump(jump);
        } else {
          nodes_[static_cast<size_t>(node - 1)]->clock.jump(jump);
        }
      });
    }
  }
  // The faults end: the network heals, crashed nodes come back.
  sched_.at(end, [this] {
    trace("faults end");
    drop_per_mille_ = 0;
    dup_per_mille_ = 0;
    max_delay_ = 2 * kMs;
    disk_errors_ = false;
    cut_.clear();
    if (!mgmtd_.up()) startMgmtd();
    faults_over_ = true;
    for (auto& n : nodes_) {
      if (n->failed_by_error) replaceDisk(*n);
      if (!n->up() && !n->lost) startNode(*n);
    }
  });
}

SimResult World::run() {
  startMgmtd();
  for (auto& n : nodes_) startNode(*n);
  // Every node registered, then the chains (as `cistern chains create`).
  sched_.runUntil(1000 * kMs);
  mgmt::CreateChainsReq create;
  create.set_replication(static_cast<uint32_t>(o_.replication));
  create.set_chains(static_cast<uint32_t>(o_.chains));
  if (auto c = mgmtd_.manager->createChains(create); !c.ok()) {
    violate("creating chains: " + c.status().toString());
    return r_;
  }
  workload_end_ = (o_.fault_ms + 2000) * kMs;
  scheduleFaults();
  for (auto& c : clients_) {
    c->start();
    spawn(clientLoop(*c));
  }
  const Micros deadline = (o_.fault_ms + o_.settle_ms) * kMs;
  std::string off = "not checked";
  for (Micros t = workload_end_; r_.ok && t <= deadline; t += 500 * kMs) {
    sched_.runUntil(t);
    if (sched_.now() < workload_end_) continue;
    off = convergence();
    if (off.empty()) break;
  }
  if (r_.ok && !off.empty()) violate("no convergence once the faults stopped: " + off);
  if (r_.ok) finalChecks();
  r_.chains_unavailable = waiting_for_gone_.size();
  r_.converged_ms = sched_.now() / kMs;
  r_.events = sched_.ran();
  return r_;
}

}  // namespace

SimResult runSimulation(uint64_t seed, const SimOptions& options) {
  World w(seed, options);
  SimResult r = w.run();
  return r;
}

}  // namespace cistern::sim
