// Sessions of clients that die. A write session keeps an unlinked file alive
// and the GC away from it until its close; a client that dies never closes.
// So every client renews a lease of its own now and then (one key per
// client, however many files it holds open), and reapSessions() ends the
// sessions of a client whose lease, and the sessions' own opening, are older
// than session_timeout_ms — as its close would have, with the length its
// bytes in storage reach (when the caller can ask storage).
#include <fmt/format.h>

#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "common/log.h"
#include "kv/key_codec.h"
#include "meta/gc_worker.h"
#include "meta/meta_store.h"
#include "meta/schema.h"

namespace cistern::meta {
namespace {

// The last sign of life of `client`: its lease, or 0 when it never renewed.
Result<int64_t> renewedNs(kv::ReadTransaction& t, const std::string& client) {
  ASSIGN_OR_RETURN(auto v, t.get(clientLeaseKey(client)));
  ClientLease lease;
  if (!v || !lease.ParseFromString(*v)) return int64_t{0};
  return lease.renewed_ns();
}

// Calls `each` on the rows under `prefix` in key order, 256 to a snapshot,
// until it returns false.
Status forEachRow(
    kv::Engine& engine, kv::Prefix prefix,
    const std::function<Result<bool>(kv::ReadTransaction&, const kv::KeyValue&)>& each) {
  const std::string end = kv::strinc(kv::KeyWriter(prefix).key());
  std::string from = kv::KeyWriter(prefix).key();
  bool more = true;
  while (more) {
    RETURN_ON_ERROR(kv::runReadTransaction(engine, [&](kv::ReadTransaction& t) -> Status {
      ASSIGN_OR_RETURN(auto rows, t.getRange(from, end, {.limit = 256}));
      more = rows.more;
      for (const auto& row : rows.kvs) {
        from = row.key + '\0';
        ASSIGN_OR_RETURN(bool go_on, each(t, row));
        if (!go_on) {
          more = false;
          break;
        }
      }
      return Status::OK();
    }));
  }
  return Status::OK();
}

struct Held {
  uint64_t ino = 0;
  uint64_t session = 0;
  std::string client;
};

// The file as the reaper saw it when it asked storage how far its bytes
// reach; the length grows to `end` only if the file is still so.
struct Probed {
  uint64_t size = 0;
  int64_t ctime_ns = 0;
  uint64_t end = 0;
};

// Asks storage how far the bytes of inode `ino` reach past its length (end
// 0: they do not, or it has no chunks, or it is unlinked and its bytes go
// anyway). An error when storage cannot say, or `ask` is false and it would
// have to: the session then waits for a later pass, so its bytes are not
// lost to a storage server that is down for a while.
Result<Probed> probeEnd(kv::Engine& engine, StoredEnd& stored, uint64_t ino, bool ask) {
  Probed p;
  std::optional<Inode> n;
  RETURN_ON_ERROR(kv::runReadTransaction(engine, [&](kv::ReadTransaction& t) -> Status {
    ASSIGN_OR_RETURN(n, loadInode(t, ino));
    return Status::OK();
  }));
  if (!n || n->type() != REGULAR || n->nlink() == 0 || n->data_inline() ||
      n->layout().chunk_size() == 0 || n->layout().chains_size() == 0)
    return p;
  if (!ask)
    return Status(ErrorCode::kConnectionFailed, "storage did not answer earlier in this pass");
  p.size = n->size();
  p.ctime_ns = n->ctime_ns();
  ASSIGN_OR_RETURN(p.end, stored.storedEnd(ino, n->layout(), n->size() / n->layout().chunk_size()));
  return p;
}

}  // namespace

Status MetaStore::renewClient(std::string_view client) {
  if (client.empty()) return Status(ErrorCode::kInvalidArgument, "renew without a client id");
  ClientLease lease;
  lease.set_renewed_ns(nowNs());
  return kv::runTransaction(engine_, [&](kv::Transaction& t) -> Status {
    t.set(clientLeaseKey(client), lease.SerializeAsString());
    return Status::OK();
  });
}

Result<size_t> MetaStore::reapSessions(size_t max, StoredEnd* stored) {
  const int64_t cutoff = nowNs() - int64_t{options_.session_timeout_ms} * 1'000'000;
  // Sessions whose client looked gone in a snapshot; each is checked again
  // in the transaction that ends it (the client may renew meanwhile).
  std::vector<Held> gone;
  std::map<std::string, int64_t> renewed;  // per client, for this pass
  RETURN_ON_ERROR(forEachRow(engine_, kv::Prefix::kSession,
                             [&](kv::ReadTransaction& t, const kv::KeyValue& row) -> Result<bool> {
                               Session s;
                               if (!s.ParseFromString(row.value) || s.opened_ns() > cutoff)
                                 return true;  // fsck reports
                               auto it = renewed.find(s.client());
                               if (it == renewed.end()) {
                                 ASSIGN_OR_RETURN(int64_t at, renewedNs(t, s.client()));
                                 it = renewed.emplace(s.client(), at).first;
                               }
                               if (it->second > cutoff) return true;
                               kv::KeyReader r(row.key);
                               ASSIGN_OR_RETURN(auto prefix, r.prefix());
                               (void)prefix;
                               Held h;
                               ASSIGN_OR_RETURN(h.ino, r.u64());
                               ASSIGN_OR_RETURN(h.session, r.u64());
                               h.client = s.client();
                               gone.push_back(std::move(h));
                               return gone.size() < max;
                             }));
  size_t ended = 0;
  bool storage_answers = true;
  for (const Held& h : gone) {
    // Asked before the transaction (storage calls do not belong in one); a
    // change of the file meanwhile (a truncate, a close that recorded a
    // length) leaves its length alone.
    Probed probed;
    if (stored) {
      auto p = probeEnd(engine_, *stored, h.ino, storage_answers);
      if (!p.ok()) {
        // One wait for storage per pass: the rest that need it wait too.
        if (storage_answers)
          CLOG_WARN("meta",
                    "sessions of clients that stopped renewing wait for storage: how far the "
                    "bytes of inode {} reach: {}",
                    h.ino, p.status().toString());
        storage_answers = false;
        continue;
      }
      probed = *p;
    }
    bool end_it = false;
    uint64_t grew_to = 0;
    auto done = mutate({}, [&](kv::Transaction& t) -> Result<std::string> {
      end_it = false;
      grew_to = 0;
      ASSIGN_OR_RETURN(auto s, t.get(sessionKey(h.ino, h.session)));
      if (!s) return std::string();  // closed meanwhile
      ASSIGN_OR_RETURN(int64_t at, renewedNs(t, h.client));
      if (at > cutoff) return std::string();  // renewed meanwhile
      end_it = true;
      uint64_t length = 0;
      if (probed.end > probed.size) {
        ASSIGN_OR_RETURN(auto n, loadInode(t, h.ino));
        if (n && n->size() == probed.size && n->ctime_ns() == probed.ctime_ns) length = probed.end;
      }
      grew_to = length;
      return closeIn(t, h.ino, h.session, length, /*wrote=*/length > 0, std::nullopt);
    });
    if (!done.ok() && done.code() != ErrorCode::kNotFound) return done.status();
    if (done.ok() && end_it) {
      CLOG_INFO(
          "meta", "ended session {} of inode {}: client {} stopped renewing{}", h.session, h.ino,
          h.client,
          grew_to ? fmt::format("; its length grew to {}, where its bytes in storage end", grew_to)
                  : std::string());
      ++ended;
    }
  }
  // Forget the leases of clients gone that long (one that comes back renews again).
  std::vector<std::string> stale;
  RETURN_ON_ERROR(forEachRow(engine_, kv::Prefix::kClientLease,
                             [&](kv::ReadTransaction&, const kv::KeyValue& row) -> Result<bool> {
                               ClientLease lease;
                               if (!lease.ParseFromString(row.value) ||
                                   lease.renewed_ns() <= cutoff)
                                 stale.push_back(row.key);
                               return stale.size() < max;
                             }));
  if (!stale.empty()) {
    RETURN_ON_ERROR(kv::runTransaction(engine_, [&](kv::Transaction& t) -> Status {
      for (const auto& key : stale) {
        // Unless renewed meanwhile.
        ASSIGN_OR_RETURN(auto v, t.get(key));
        ClientLease lease;
        if (v && lease.ParseFromString(*v) && lease.renewed_ns() > cutoff) continue;
        t.clear(key);
      }
      return Status::OK();
    }));
  }
  return ended;
}

}  // namespace cistern::meta
