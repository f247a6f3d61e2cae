// The cluster-state tables in the KV (docs/meta_kv_schema.md, "Cluster
// state"): mgmtd writes them, meta reads the chain table to lay out files,
// clients get them through mgmtd's GetRouting.
//
//   target   (kTarget, target id)   -> mgmt::Target
//   chain    (kChain, chain id)     -> mgmt::Chain (an empty value: written by
//                                      an older version, one target, version 1)
//   version  (kRoutingVersion)      -> routing version (kv::encodeCounter)
//   config   (kClusterConfig)       -> mgmt::ClusterConfig
//   node     (kNode, name)          -> mgmt::Node (a cluster's storage nodes)
//   ids      (kRoutingVersion, "target-ids") -> the last target id given out
//   history  (kChainHistory, chain id, version) -> mgmt::ChainEvent (each
//                                      chain's last kChainHistoryKept versions)
#pragma once

#include <cstdint>
#include <string>

namespace cistern::kv {

std::string targetKey(uint32_t target_id);
std::string targetBegin();
std::string targetEnd();
std::string chainKey(uint32_t chain_id);
std::string chainBegin();
std::string chainEnd();
std::string routingVersionKey();
std::string clusterConfigKey();
std::string nodeKey(const std::string& name);
std::string nodeBegin();
std::string nodeEnd();
std::string targetIdCounterKey();
inline constexpr uint64_t kChainHistoryKept = 64;
std::string chainHistoryKey(uint32_t chain_id, uint64_t version);
std::string chainHistoryBegin(uint32_t chain_id);  // chain 0: every chain's
std::string chainHistoryEnd(uint32_t chain_id);

}  // namespace cistern::kv
