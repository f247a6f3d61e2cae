#include "client/client_config.h"

#include "common/config.h"

namespace cistern::client {

void bindClientOptions(ConfigBinder& b, const std::string& p, Client::Options* o) {
  b.bind(p + ".io_parallel_max", &o->io_parallel_max,
         "chunk reads or writes in flight for one call (at least 1)");
  b.bind(p + ".readahead_max_bytes", &o->readahead_max_bytes,
         "largest read-ahead window of a sequential reader (64 KiB to 256 MiB)");
  b.bind(p + ".write_behind_bytes", &o->write_behind_bytes,
         "full write buffers of a file written out while its writer goes on (at most 1 GiB)");
  b.bind(p + ".shm_bytes", &o->shm_bytes,
         "shared memory lent to storage servers on this host for reads and writes (0: off; at "
         "most 4 GiB)");
  b.bind(p + ".shm_readahead_windows", &o->shm_readahead_windows,
         "read-ahead windows in that shared memory (at most 64)");
  b.bind(p + ".short_circuit_reads", &o->short_circuit_reads,
         "read chunks from the files of storage servers on this host where they allow it and "
         "this process can open them (verified against the servers' CRCs)");
  b.bind(p + ".sync_each_write", &o->sync_each_write,
         "every chunk write is durable when it returns (false: durable at fsync and close, or "
         "within the servers' sync interval)");
  b.bind(p + ".inline_max_bytes", &o->inline_max_bytes,
         "a new file written whole and no larger than this may keep its bytes in the metadata "
         "(0: never; at most 64 KiB)");
  b.bind(p + ".session_renew_ms", &o->session_renew_ms,
         "how often the client tells meta it is alive, in ms (0: never; at most 60000, well "
         "under meta.session_timeout_ms)");
}

Status validateClientOptions(const Client::Options& o) {
  RETURN_ON_ERROR(checkOptionRange("client.io_parallel_max", o.io_parallel_max, 1, 1024));
  if (o.readahead_max_bytes < (64u << 10) || o.readahead_max_bytes > (256ull << 20))
    return badOptionValue("client.readahead_max_bytes", o.readahead_max_bytes,
                          "in 64 KiB..256 MiB");
  if (o.write_behind_bytes > (1ull << 30))
    return badOptionValue("client.write_behind_bytes", o.write_behind_bytes, "at most 1 GiB");
  if (o.shm_bytes > (4ull << 30))
    return badOptionValue("client.shm_bytes", o.shm_bytes, "at most 4 GiB");
  if (o.shm_readahead_windows > 64)
    return badOptionValue("client.shm_readahead_windows", o.shm_readahead_windows, "at most 64");
  if (o.inline_max_bytes > (64u << 10))
    return badOptionValue("client.inline_max_bytes", o.inline_max_bytes, "at most 64 KiB");
  if (o.session_renew_ms > 60000)
    return badOptionValue("client.session_renew_ms", o.session_renew_ms, "at most 60000");
  return Status::OK();
}

}  // namespace cistern::client
