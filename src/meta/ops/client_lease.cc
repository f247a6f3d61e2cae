// Sessions of clients that die. A write session keeps an unlinked file alive
// and the GC away from it until its close; a client that dies never closes.
// So every client renews a lease of its own now and then (one key per
// client, however many files it holds open), and reapSessions() ends the
// sessions of a client whose lease, and the sessions' own opening, are older
// than session_timeout_ms — as its close would have, keeping the length.
#include <fmt/format.h>

#include <map>
#include <vector>

#include "common/log.h"
#include "kv/key_codec.h"
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

struct Held {
  uint64_t ino = 0;
  uint64_t session = 0;
  std::string client;
};

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

Result<size_t> MetaStore::reapSessions(size_t max) {
  const int64_t cutoff = nowNs() - int64_t{options_.session_timeout_ms} * 1'000'000;
  const std::string begin = kv::KeyWriter(kv::Prefix::kSession).key();
  const std::string end = kv::strinc(begin);
  // Sessions whose client looked gone in a snapshot; each is checked again
  // in the transaction that ends it (the client may renew meanwhile).
  std::vector<Held> gone;
  std::map<std::string, int64_t> renewed;  // per client, for this pass
  std::string from = begin;
  while (from < end && gone.size() < max) {
    bool more = false;
    RETURN_ON_ERROR(kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
      ASSIGN_OR_RETURN(auto rows, t.getRange(from, end, {.limit = 256}));
      more = rows.more;
      for (const auto& row : rows.kvs) {
        from = row.key + '\0';
        Session s;
        if (!s.ParseFromString(row.value)) continue;  // fsck's to report
        if (s.opened_ns() > cutoff) continue;
        auto it = renewed.find(s.client());
        if (it == renewed.end()) {
          ASSIGN_OR_RETURN(int64_t at, renewedNs(t, s.client()));
          it = renewed.emplace(s.client(), at).first;
        }
        if (it->second > cutoff) continue;
        kv::KeyReader r(row.key);
        ASSIGN_OR_RETURN(auto prefix, r.prefix());
        (void)prefix;
        Held h;
        ASSIGN_OR_RETURN(h.ino, r.u64());
        ASSIGN_OR_RETURN(h.session, r.u64());
        h.client = s.client();
        gone.push_back(std::move(h));
        if (gone.size() == max) break;
      }
      return Status::OK();
    }));
    if (!more) break;
  }
  size_t ended = 0;
  for (const Held& h : gone) {
    bool end_it = false;
    auto done = mutate({}, [&](kv::Transaction& t) -> Result<std::string> {
      end_it = false;
      ASSIGN_OR_RETURN(auto s, t.get(sessionKey(h.ino, h.session)));
      if (!s) return std::string();  // closed meanwhile
      ASSIGN_OR_RETURN(int64_t at, renewedNs(t, h.client));
      if (at > cutoff) return std::string();  // renewed meanwhile
      end_it = true;
      return closeIn(t, h.ino, h.session, 0, false, std::nullopt);
    });
    if (!done.ok() && done.code() != ErrorCode::kNotFound) return done.status();
    if (done.ok() && end_it) {
      CLOG_INFO("meta", "ended session {} of inode {}: client {} stopped renewing", h.session,
                h.ino, h.client);
      ++ended;
    }
  }
  // Forget the leases of clients gone that long (one that comes back renews again).
  const std::string leases = kv::KeyWriter(kv::Prefix::kClientLease).key();
  const std::string leases_end = kv::strinc(leases);
  std::vector<std::string> stale;
  from = leases;
  while (from < leases_end && stale.size() < max) {
    bool more = false;
    RETURN_ON_ERROR(kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
      ASSIGN_OR_RETURN(auto rows, t.getRange(from, leases_end, {.limit = 256}));
      more = rows.more;
      for (const auto& row : rows.kvs) {
        from = row.key + '\0';
        ClientLease lease;
        if (!lease.ParseFromString(row.value) || lease.renewed_ns() <= cutoff)
          stale.push_back(row.key);
      }
      return Status::OK();
    }));
    if (!more) break;
  }
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
