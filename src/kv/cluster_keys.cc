#include "kv/cluster_keys.h"

#include "kv/key_codec.h"

namespace cistern::kv {

std::string targetKey(uint32_t id) { return KeyWriter(Prefix::kTarget).u64(id).key(); }
std::string targetBegin() { return KeyWriter(Prefix::kTarget).key(); }
std::string targetEnd() { return strinc(targetBegin()); }
std::string chainKey(uint32_t id) { return KeyWriter(Prefix::kChain).u64(id).key(); }
std::string chainBegin() { return KeyWriter(Prefix::kChain).key(); }
std::string chainEnd() { return strinc(chainBegin()); }
std::string chainHistoryKey(uint32_t id, uint64_t version) {
  return KeyWriter(Prefix::kChainHistory).u64(id).u64(version).key();
}
std::string chainHistoryBegin(uint32_t id) {
  return id == 0 ? KeyWriter(Prefix::kChainHistory).key()
                 : KeyWriter(Prefix::kChainHistory).u64(id).key();
}
std::string chainHistoryEnd(uint32_t id) { return strinc(chainHistoryBegin(id)); }
std::string routingVersionKey() { return KeyWriter(Prefix::kRoutingVersion).key(); }
std::string clusterConfigKey() { return KeyWriter(Prefix::kClusterConfig).key(); }
std::string nodeKey(const std::string& name) { return KeyWriter(Prefix::kNode).bytes(name).key(); }
std::string nodeBegin() { return KeyWriter(Prefix::kNode).key(); }
std::string nodeEnd() { return strinc(nodeBegin()); }
std::string targetIdCounterKey() {
  return KeyWriter(Prefix::kRoutingVersion).bytes("target-ids").key();
}

}  // namespace cistern::kv
