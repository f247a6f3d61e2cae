// The routing table: targets, chains and where meta listens, kept in the KV
// (kv/cluster_keys.h) with a version that changes whenever any of it does,
// so that a client holding version v knows its routing is current while
// GetRouting still answers v. mgmtd is its only writer.
//
// Thread-safe: each call is one KV transaction.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "kv/engine.h"
#include "mgmt.pb.h"

namespace cistern::mgmtd {

// What one machine's mgmtd knows at start: its targets, each the only
// member of its own chain (replication 1), and meta's endpoint.
struct LocalLayout {
  std::string meta_endpoint;
  struct Target {
    uint32_t id = 0;  // also its chain's id; > 0
    std::string endpoint;
    std::string path;
  };
  std::vector<Target> targets;
};

// Writes `layout` as the routing table: each target and its chain, and the
// meta endpoint. Rows that already say the same are left alone; if any row
// changed, the version goes up by one (a first publish makes it 1). Returns
// the version now in the KV. Chains of targets no longer listed stay (a
// target's data does not vanish because a process started with fewer).
Result<uint64_t> publish(kv::Engine& kv, const LocalLayout& layout);

// The routing version in the KV (0 before the first publish).
Result<uint64_t> routingVersion(kv::ReadTransaction& t);
// Moves the routing version up by one in `t`; returns the new one.
Result<uint64_t> bumpRoutingVersion(kv::Transaction& t);
// A cluster-state row (`what` names it in the error).
template <typename Msg>
Result<Msg> parseRow(const std::string& bytes, const char* what) {
  Msg m;
  if (!m.ParseFromString(bytes))
    return Status(ErrorCode::kCorruption, std::string(what) + " row does not parse");
  return m;
}

// Lists (`serving`) or unlists a cluster's meta server at `endpoint` in
// the routing table; the version moves if the list changed. Returns the
// version now.
Result<uint64_t> setMetaServer(kv::Engine& kv, const std::string& endpoint, bool serving);

// The routing table as stored (targets and chains by id; `failed` false:
// health is the caller's to fill in). kNotFound before the first publish.
Result<mgmt::Routing> loadRouting(kv::Engine& kv);

}  // namespace cistern::mgmtd
