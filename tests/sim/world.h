// One run of the deterministic cluster simulation (docs/chain_protocol.md,
// "The simulation"): mgmtd's real ClusterManager (chain states, placement,
// re-replication) on an in-memory KV, storage nodes whose chain tables are
// the real ChainTable (routing, serving lease, restart fence) and whose
// forwarded changes are judged by the real classifyForward, the storage
// service's replication steps (storage_chains.cc) written over the
// simulation's runtime, and clients that write and read with retries —
// all over a simulated network, disk and clocks driven by one seed.
//
// Faults during the first part of a run: messages lost, duplicated,
// delayed and so reordered; storage nodes crashed (losing memory and
// unsynced writes) and restarted, or lost for good (then replaced);
// nodes and mgmtd cut off; mgmtd crashed (a new primary); disk writes
// failing; clocks jumping forward. Then the faults stop and the checkers
// run: no acknowledged write lost, no read older than a write acknowledged
// or a read returned before it began, one content per (chunk version,
// chain version), every chain back to its replication factor with its
// replicas agreeing.
#pragma once

#include <cstdint>
#include <string>

namespace cistern::sim {

struct SimOptions {
  int storage_nodes = 5;
  int replication = 3;
  int chains = 3;
  int chunks = 6;
  int clients = 3;
  // Simulated milliseconds.
  int64_t fault_ms = 12000;   // faults happen in [0, fault_ms)
  int64_t settle_ms = 40000;  // then the run must converge within this
  uint32_t heartbeat_timeout_ms = 1500;
  uint32_t replace_after_ms = 4000;
  // Test-only mutations of the protocol, which the checkers must catch.
  bool bug_ack_at_head = false;  // the head answers before its successors applied
  bool bug_read_dirty = false;   // a replica reads chunks with a change in flight
  // A head whose disk failed a change its successors took sends them its
  // old copy back (the protocol before the simulation found it un-commits
  // what a reader of the tail may have seen).
  bool bug_head_takes_back = false;
  bool trace = false;  // every step to stderr (replaying one seed)
};

struct SimResult {
  bool ok = true;
  std::string violation;  // the first checker failure, with its simulated time
  // What the run did (for the swarm's report and the tests' sanity checks).
  uint64_t writes_acked = 0, writes_unknown = 0, reads_checked = 0;
  uint64_t crashes = 0, lost_nodes = 0, partitions = 0, mgmtd_crashes = 0;
  uint64_t messages = 0, events = 0;
  int64_t converged_ms = 0;  // simulated time at which the checks passed
  // Chains left waiting for a LASTSRV member that is gone for good (their
  // data unavailable, not lost; the checks skip them).
  uint64_t chains_unavailable = 0;
};

SimResult runSimulation(uint64_t seed, const SimOptions& options = {});

}  // namespace cistern::sim
