// StorageServer: the storage role of `cistern serve --role storage`: one
// target (a directory on one disk) served as a replica of the cluster's
// chains (docs/chain_protocol.md, "Storage servers").
//
// At start it opens the target, starts the storage service and registers
// its node with mgmtd (RegisterNode: the target gets its id), then beats
// every `heartbeat_ms` (0: a fifth of mgmtd's heartbeat timeout). Each beat
// answered renews the serving lease (storage/chain_table.h) and brings the
// routing table when it moved; a beat reports the chains whose resync into
// this target finished. A mgmtd that answers kNotPrimary, or none, makes
// the next beat go to the next endpoint of `mgmtd`. A resync thread streams
// every chain whose successor of this target is SYNCING.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "net/endpoint.h"
#include "server/auth_options.h"
#include "storage/chunk_engine.h"
#include "storage/storage_service_options.h"

namespace cistern::server {

struct StorageServerOptions {
  std::string listen = "127.0.0.1:7430";
  // The address others reach it at, if not `listen`'s (0.0.0.0, a port 0).
  std::string advertise;
  std::string node;  // this node's name in the cluster (unique; required)
  std::string rack;
  std::string target = "./cistern-data/target0";
  std::vector<std::string> mgmtd = {"127.0.0.1:7420"};
  uint32_t heartbeat_ms = 0;
  // The scrub re-reads every chunk at this rate and has a bad copy repaired
  // from a peer's (docs/chain_protocol.md, "Repair"); 0: no scrub.
  uint64_t scrub_bytes_per_second = 32ull << 20;
  storage::ChunkEngineOptions engine;
  storage::StorageServiceOptions service;
  AuthOptions auth;

  void bind(ConfigBinder& b);  // storage.* and auth.*
  Status validate() const;
};

class StorageServer {
 public:
  // Returns once the service is listening; registration and beats go on
  // in the background (a mgmtd not up yet is waited for).
  static Result<std::unique_ptr<StorageServer>> start(const StorageServerOptions& options);
  ~StorageServer();
  net::Endpoint endpoint() const;
  uint32_t target() const;  // 0 until registered

  struct Impl;

 private:
  explicit StorageServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cistern::server
