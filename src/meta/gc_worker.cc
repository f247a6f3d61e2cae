#include "meta/gc_worker.h"

#include <fmt/format.h>

#include "common/log.h"
#include "kv/key_codec.h"
#include "meta/schema.h"

namespace cistern::meta {

Result<size_t> GcWorker::runOnce(size_t max_entries) {
  std::vector<kv::KeyValue> batch;
  RETURN_ON_ERROR(kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
    ASSIGN_OR_RETURN(auto rows,
                     t.getRange(gcBegin(), gcEnd(), {.limit = static_cast<uint32_t>(max_entries)}));
    batch = std::move(rows.kvs);
    return Status::OK();
  }));
  size_t done = 0;
  bool synced = false;
  for (const auto& entry : batch) {
    kv::KeyReader r(entry.key);
    ASSIGN_OR_RETURN(auto prefix, r.prefix());
    (void)prefix;
    ASSIGN_OR_RETURN(uint64_t ino, r.u64());
    GcEntry queued;
    if (!queued.ParseFromString(entry.value)) {
      return Status(ErrorCode::kCorruption,
                    fmt::format("gc entry of inode {} does not parse", ino));
    }
    // Skip files still being written; for truncations, never delete below the current end.
    bool skip = false;
    uint64_t current_size = 0;
    RETURN_ON_ERROR(kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
      ASSIGN_OR_RETURN(skip, hasSessions(t, ino));
      ASSIGN_OR_RETURN(auto live, loadInode(t, ino));
      if (live && live->nlink() > 0) current_size = live->size();
      return Status::OK();
    }));
    if (skip) continue;
    uint64_t chunk = queued.layout().chunk_size();
    if (chunk == 0)
      return Status(ErrorCode::kCorruption, fmt::format("gc entry of inode {} has no layout", ino));
    uint64_t start = queued.whole_file() ? 0
                                         : std::max<uint64_t>(queued.first_chunk(),
                                                              (current_size + chunk - 1) / chunk);
    if (!queued.no_chunks()) {
      // The entry may come from an unsynced commit (an unlink, a truncate):
      // it is made durable before any chunk goes, so that a crash cannot
      // bring back a name whose bytes are gone.
      if (!synced) RETURN_ON_ERROR(engine_.sync());
      synced = true;
      RETURN_ON_ERROR(remover_.removeFrom(ino, queued.layout(), start));
    }
    // Delete the entry only if nobody re-queued it meanwhile.
    RETURN_ON_ERROR(kv::runTransaction(engine_, [&](kv::Transaction& t) -> Status {
      ASSIGN_OR_RETURN(auto now, t.get(entry.key));
      if (now && *now == entry.value) t.clear(entry.key);
      return Status::OK();
    }));
    CLOG_DEBUG("meta", "gc: inode {} chunks from {} removed", ino, start);
    ++done;
  }
  return done;
}

}  // namespace cistern::meta
