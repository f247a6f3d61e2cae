#include "meta/record_expiry.h"

#include <string>
#include <vector>

#include "common/log.h"
#include "kv/key_codec.h"
#include "meta.pb.h"

namespace cistern::meta {

Result<size_t> expireMutationRecords(kv::Engine& engine, int64_t now_ns, int64_t ttl_ns,
                                     size_t max_deletes) {
  const std::string begin = kv::KeyWriter(kv::Prefix::kIdempotency).key();
  const std::string end = kv::strinc(begin);
  const int64_t cutoff = now_ns - ttl_ns;
  std::string from = begin;
  size_t deleted = 0;
  while (deleted < max_deletes && from < end) {
    std::vector<std::string> expired;
    bool more = false;
    RETURN_ON_ERROR(kv::runReadTransaction(engine, [&](kv::ReadTransaction& t) -> Status {
      expired.clear();
      size_t room = max_deletes - deleted;
      ASSIGN_OR_RETURN(auto rows, t.getRange(from, end, {.limit = 256}));
      more = rows.more;
      std::string next = rows.kvs.empty() ? end : rows.kvs.back().key + '\0';
      for (const auto& row : rows.kvs) {
        MutationRecord rec;
        if (rec.ParseFromString(row.value) && rec.time_ns() > cutoff) {
          // Live: this client's later records are newer still. On to the next client.
          kv::KeyReader r(row.key);
          ASSIGN_OR_RETURN(auto p, r.prefix());
          (void)p;
          ASSIGN_OR_RETURN(std::string client, r.bytes());
          next = kv::strinc(kv::KeyWriter(kv::Prefix::kIdempotency).bytes(client).key());
          more = true;
          break;
        }
        expired.push_back(row.key);  // expired, or unreadable and of no use to anyone
        if (expired.size() == room) {
          next = row.key + '\0';
          break;
        }
      }
      from = more ? next : end;
      return Status::OK();
    }));
    if (!expired.empty()) {
      RETURN_ON_ERROR(kv::runTransaction(engine, [&](kv::Transaction& t) -> Status {
        for (const auto& key : expired) t.clear(key);
        return Status::OK();
      }));
      deleted += expired.size();
    }
  }
  if (deleted > 0) CLOG_DEBUG("meta", "expired {} idempotency records", deleted);
  return deleted;
}

}  // namespace cistern::meta
