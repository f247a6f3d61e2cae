#include "storage/remote_chunk_remover.h"

#include <fmt/format.h>

#include <chrono>
#include <set>
#include <thread>

#include "storage.pb.h"

namespace cistern::storage {

Status RemoteChunkRemover::removeFrom(uint64_t ino, const meta::Layout& layout, uint64_t first) {
  if (layout.chains_size() == 0)
    return Status(ErrorCode::kInvalidArgument, fmt::format("inode {} has no chains", ino));
  if (first > UINT32_MAX) return Status::OK();  // chunk indexes are 32-bit: nothing lies there
  static const net::Method kRemove = net::Method::of("cistern.storage.StorageService.Remove");
  const std::set<uint32_t> chains(layout.chains().begin(), layout.chains().end());
  for (uint32_t chain : chains) {
    ASSIGN_OR_RETURN(net::Endpoint to, route_(chain));
    RemoveReq req;
    req.set_qos(QOS_BACKGROUND);
    req.mutable_from()->set_inode(ino);
    req.mutable_from()->set_index(static_cast<uint32_t>(first));
    req.set_limit(batch_);
    for (;;) {
      RemoveResp resp;
      Status s;
      auto backoff = std::chrono::milliseconds(10);
      for (uint32_t attempt = 0;; ++attempt) {
        resp.Clear();
        s = client_.callSync(to, kRemove, req, &resp);
        if (s.code() != ErrorCode::kTargetBusy || attempt >= busy_retries_) break;
        std::this_thread::sleep_for(backoff);
        backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
      }
      RETURN_ON_ERROR(s.withContext(
          fmt::format("remove chunks of inode {} from {} on chain {}", ino, first, chain)));
      if (!resp.more()) break;
    }
  }
  return Status::OK();
}

}  // namespace cistern::storage
