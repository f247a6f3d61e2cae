// The etcd engine: kv::Engine over an etcd cluster (docs/kv.md, "etcd"), so
// that several meta and mgmtd processes share one namespace.
//
// A transaction reads one etcd revision (taken when it begins) merged with
// its own buffered writes (BufferedTxn) and commits as one etcd Txn:
//  - every range it read is guarded by a compare that no key in it changed
//    after the read revision (mod_revision < read + 1: a phantom insert or
//    any change fails the commit), and every key it read and saw by one
//    that it still has its mod_revision (a delete fails the commit);
//  - past the compare budget, the per-key compares give way to one compare
//    on a key every deleting commit bumps ("deletions since the read
//    revision"): conservative, never wrong;
//  - atomic adds read the counter's current value and mod_revision and put
//    the sum under a compare on that mod_revision; when only the counters
//    moved, etcd's answer (a nested transaction on the failure branch)
//    brings their new values and the add is tried again — adds to one
//    counter do not conflict, they serialize;
//  - every commit also puts a marker key of its own (under a short etcd
//    lease, so markers go by themselves) compared absent; a commit whose
//    answer is lost after it was sent (a member cut off or stopped) is
//    settled by a fence: a put of the marker under the same compare, on
//    any member. The fence succeeding means the commit did not apply and
//    never will (kTxnConflict: try again); failing, it reads the marker the
//    commit put (committed). Only when no member settles it within
//    `resolve_ms` is it kCommitUnknown.
// Limits that are etcd's, checked before a request is sent and reported
// with the limit's name: operations per Txn (--max-txn-ops, 128) and bytes
// per request (--max-request-bytes, 1.5 MiB), both kTxnTooLarge.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "kv/engine.h"

namespace cistern::kv {

struct EtcdEngineOptions {
  EngineOptions engine;
  // host:port of the cluster's client URLs.
  std::vector<std::string> endpoints;
  // Every key of this engine lives under it in etcd (one etcd serves
  // several namespaces or tests side by side). Default: "cistern/".
  std::string prefix = "cistern/";
  uint32_t timeout_ms = 5000;  // per etcd request
  // etcd's --max-txn-ops and --max-request-bytes (its defaults).
  uint32_t txn_ops_max = 128;
  uint64_t request_bytes_max = 1536 * 1024;
  // Tries of a commit whose only moved compares are its counters'.
  uint32_t add_attempts_max = 64;
  // How long fences may try to settle a commit whose answer was lost (at
  // most 20 s: markers live at least 30 s).
  uint32_t resolve_ms = 15000;
};

// Fails with kInvalidArgument for bad endpoints, kConnectionFailed when no
// endpoint answers.
Result<std::unique_ptr<Engine>> openEtcdEngine(const EtcdEngineOptions& options);

}  // namespace cistern::kv
