#include "mgmtd/routing_table.h"

#include <algorithm>

#include <fmt/format.h>

#include "kv/cluster_keys.h"
#include "kv/key_codec.h"

namespace cistern::mgmtd {
namespace {

// Sets `key` to `value` unless it holds that already; true when it changed.
Result<bool> setIfChanged(kv::Transaction& t, const std::string& key, const std::string& value) {
  ASSIGN_OR_RETURN(auto old, t.get(key));
  if (old && *old == value) return false;
  t.set(key, value);
  return true;
}

uint32_t idOf(const std::string& key) {
  kv::KeyReader r(key);
  (void)r.prefix();
  auto id = r.u64();
  return id.ok() ? static_cast<uint32_t>(*id) : 0;
}

}  // namespace

Result<uint64_t> routingVersion(kv::ReadTransaction& t) {
  ASSIGN_OR_RETURN(auto raw, t.get(kv::routingVersionKey()));
  return raw ? static_cast<uint64_t>(kv::decodeCounter(*raw)) : 0;
}

Result<uint64_t> bumpRoutingVersion(kv::Transaction& t) {
  ASSIGN_OR_RETURN(uint64_t v, routingVersion(t));
  t.set(kv::routingVersionKey(), kv::encodeCounter(static_cast<int64_t>(v + 1)));
  return v + 1;
}

Result<uint64_t> publish(kv::Engine& kv, const LocalLayout& layout) {
  for (const auto& t : layout.targets) {
    if (t.id == 0) return Status(ErrorCode::kInvalidArgument, "target id 0");
  }
  uint64_t version = 0;
  RETURN_ON_ERROR(kv::runTransaction(kv, [&](kv::Transaction& t) -> Status {
    bool changed = false;
    mgmt::ClusterConfig config;
    config.set_meta_endpoint(layout.meta_endpoint);
    ASSIGN_OR_RETURN(bool c, setIfChanged(t, kv::clusterConfigKey(), config.SerializeAsString()));
    changed |= c;
    for (const auto& target : layout.targets) {
      mgmt::Target row;
      row.set_id(target.id);
      row.set_endpoint(target.endpoint);
      row.set_path(target.path);
      row.set_chain(target.id);
      ASSIGN_OR_RETURN(c, setIfChanged(t, kv::targetKey(target.id), row.SerializeAsString()));
      changed |= c;
      mgmt::Chain chain;
      chain.set_id(target.id);
      chain.set_version(1);
      chain.add_targets(target.id);
      ASSIGN_OR_RETURN(c, setIfChanged(t, kv::chainKey(target.id), chain.SerializeAsString()));
      changed |= c;
    }
    ASSIGN_OR_RETURN(version, routingVersion(t));
    if (changed || version == 0) {
      ASSIGN_OR_RETURN(version, bumpRoutingVersion(t));
    }
    return Status::OK();
  }));
  return version;
}

Result<mgmt::Routing> loadRouting(kv::Engine& kv) {
  mgmt::Routing out;
  RETURN_ON_ERROR(kv::runReadTransaction(kv, [&](kv::ReadTransaction& t) -> Status {
    out.Clear();
    ASSIGN_OR_RETURN(auto raw, t.get(kv::routingVersionKey()));
    if (!raw) return Status(ErrorCode::kNotFound, "no routing table yet (mgmtd has not started)");
    out.set_version(static_cast<uint64_t>(kv::decodeCounter(*raw)));
    ASSIGN_OR_RETURN(auto config_raw, t.get(kv::clusterConfigKey()));
    mgmt::ClusterConfig config;
    if (config_raw && !config.ParseFromString(*config_raw))
      return Status(ErrorCode::kCorruption, "cluster configuration row does not parse");
    out.set_meta_endpoint(config.meta_endpoint());
    for (const auto& m : config.meta_endpoints()) {
      out.add_meta_endpoints(m);
      if (out.meta_endpoint().empty()) out.set_meta_endpoint(m);
    }
    ASSIGN_OR_RETURN(auto targets, t.getRange(kv::targetBegin(), kv::targetEnd(), {}));
    for (const auto& row : targets.kvs) {
      ASSIGN_OR_RETURN(*out.add_targets(), parseRow<mgmt::Target>(row.value, "target"));
    }
    ASSIGN_OR_RETURN(auto chains, t.getRange(kv::chainBegin(), kv::chainEnd(), {}));
    for (const auto& row : chains.kvs) {
      ASSIGN_OR_RETURN(mgmt::Chain c, parseRow<mgmt::Chain>(row.value, "chain"));
      if (row.value.empty()) {  // written before mgmtd kept chain records
        c.set_id(idOf(row.key));
        c.set_version(1);
        c.add_targets(c.id());
      }
      *out.add_chains() = std::move(c);
    }
    return Status::OK();
  }));
  return out;
}

Result<uint64_t> setMetaServer(kv::Engine& kv, const std::string& endpoint, bool serving) {
  uint64_t version = 0;
  RETURN_ON_ERROR(kv::runTransaction(kv, [&](kv::Transaction& t) -> Status {
    ASSIGN_OR_RETURN(auto raw, t.get(kv::clusterConfigKey()));
    mgmt::ClusterConfig config;
    if (raw) {
      ASSIGN_OR_RETURN(config, parseRow<mgmt::ClusterConfig>(*raw, "cluster configuration"));
    }
    std::vector<std::string> list(config.meta_endpoints().begin(), config.meta_endpoints().end());
    auto it = std::find(list.begin(), list.end(), endpoint);
    const bool listed = it != list.end();
    if (listed == serving) {
      ASSIGN_OR_RETURN(version, routingVersion(t));
      return Status::OK();
    }
    if (serving) {
      list.push_back(endpoint);
    } else {
      list.erase(it);
    }
    config.clear_meta_endpoints();
    for (auto& m : list) config.add_meta_endpoints(m);
    t.set(kv::clusterConfigKey(), config.SerializeAsString());
    ASSIGN_OR_RETURN(version, bumpRoutingVersion(t));
    return Status::OK();
  }));
  return version;
}

}  // namespace cistern::mgmtd
