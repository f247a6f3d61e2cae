// Every key prefix in the KV, in one place.
//
// A key starts with one prefix byte that says which table it belongs to; the
// rest is encoded with key_codec.h so that keys sort in the order of their
// components. Values of existing prefixes are persisted and never reused or
// renumbered. docs/meta_kv_schema.md describes the key and value layout of each.
#pragma once

#include <cstdint>
#include <string_view>

namespace cistern::kv {

// clang-format off
#define CISTERN_KV_PREFIXES(X)                                                          \
  /* cluster state (mgmtd) */                                                            \
  X(kClusterConfig,  0x01, "cluster configuration record")                              \
  X(kNode,           0x02, "node id -> node info (address, roles, last heartbeat)")      \
  X(kTarget,         0x03, "target id -> target info (node, path, state)")               \
  X(kChain,          0x04, "chain id -> chain (version, ordered targets)")               \
  X(kRoutingVersion, 0x05, "routing table version counter")                             \
  X(kMgmtdLease,     0x06, "primary mgmtd lease")                                       \
  X(kChainHistory,   0x07, "(chain id, version) -> the chain at that version (last 64)")  \
  /* namespace (meta) */                                                                 \
  X(kInode,          0x10, "inode id -> inode attributes and layout")                   \
  X(kDentry,         0x11, "(parent inode, name) -> child inode and type")              \
  X(kInodeAlloc,     0x12, "inode id range allocator state")                            \
  X(kSession,        0x13, "(inode, session id) -> open write session")                 \
  X(kGcQueue,        0x14, "(inode, first chunk, end chunk) -> chunks to delete")        \
  X(kIdempotency,    0x15, "(client id, request id) -> result of a mutation")           \
  X(kXattr,          0x16, "(inode, name) -> extended attribute value")                 \
  X(kQuota,          0x17, "directory -> quota; (directory, bytes|inodes) -> its use")        \
  X(kStats,          0x18, "namespace counters (inodes in use), atomic adds")          \
  X(kInlineData,     0x19, "inode id -> the bytes of a small file kept in the KV")      \
  X(kClientLease,    0x1a, "client id -> when it last renewed (its sessions live on)")  \
  X(kTenant,         0x1b, "tenant name -> tenant (id, subtree root, quotas)")          \
  X(kRevoked,        0x1c, "token id -> when the revoked token expires")                \
  /* tests and tools */                                                                  \
  X(kTest,           0x7f, "keys written by tests and benchmarks")
// clang-format on

enum class Prefix : uint8_t {
#define CISTERN_X(name, value, desc) name = value,
  CISTERN_KV_PREFIXES(CISTERN_X)
#undef CISTERN_X
};

std::string_view prefixName(Prefix p);

}  // namespace cistern::kv
