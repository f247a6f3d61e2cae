// Options of StorageService (storage_service.h), apart from it so that code
// composing services (server/local_cluster.h) does not pull in Asio.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace cistern {
class ConfigBinder;
}

namespace cistern::storage {

struct StorageServiceOptions {
  uint32_t blocking_threads = 8;
  uint64_t batch_read_bytes_max = 64ull << 20;
  uint64_t queued_bytes_max = 256ull << 20;
  double background_share = 0.25;
  // Same-host clients' shared memory mapped for reads (shm_registry.h).
  uint32_t shm_attached_max = 64;
  uint64_t shm_bytes_max = 1ull << 30;
  // Batch reads served on the I/O threads (storage_service.h): their byte
  // limit (0 turns it off), and ranges in flight per I/O thread. Defaults:
  // 64 KiB, 64.
  uint64_t loop_read_bytes_max = 64 << 10;
  uint32_t loop_reads_max = 64;
  // Clients on this host may read chunk bytes from the target's files
  // themselves (Locate; docs/client.md, "Short-circuit reads"). Only those
  // that can open the files use it: the server's user, or root.
  bool short_circuit_reads = true;
  // Bytes a second that resyncs into successors (a replacement, a
  // rebalance's new replica, a node back from an outage) copy from this
  // target, all chains together; 0: no limit (docs/chain_protocol.md,
  // "Recovery rate").
  uint64_t recovery_bytes_per_second = 0;

  // Binds the fields a deployment tunes to `<prefix>.<name>` keys.
  void bind(ConfigBinder& b, const std::string& prefix);
  // kInvalidArgument naming the field when a value cannot work (no
  // blocking threads, a background share outside (0, 1]).
  Status validate() const;
};

}  // namespace cistern::storage
