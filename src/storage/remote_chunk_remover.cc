#include "storage/remote_chunk_remover.h"

#include <fmt/format.h>

#include <chrono>
#include <map>
#include <thread>

#include "storage.pb.h"

namespace cistern::storage {

Status RemoteChunkRemover::removeChunks(uint64_t ino, const meta::Layout& layout, uint64_t first,
                                        uint64_t count) {
  if (layout.chains_size() == 0)
    return Status(ErrorCode::kInvalidArgument, fmt::format("inode {} has no chains", ino));
  static const net::Method kRemove = net::Method::of("cistern.storage.StorageService.Remove");
  const uint64_t width = static_cast<uint64_t>(layout.chains_size());
  for (uint64_t start = first; start < first + count; start += uint64_t{batch_} * width) {
    // One Remove per chain for the next `batch` chunks of each.
    uint64_t stop = std::min(first + count, start + uint64_t{batch_} * width);
    std::map<uint32_t, RemoveReq> per_chain;
    for (uint64_t i = start; i < stop; ++i) {
      RemoveReq& req = per_chain[layout.chains(static_cast<int>(i % width))];
      req.set_qos(QOS_BACKGROUND);
      auto* c = req.add_chunks();
      c->set_inode(ino);
      c->set_index(static_cast<uint32_t>(i));
    }
    for (auto& [chain, req] : per_chain) {
      ASSIGN_OR_RETURN(net::Endpoint to, route_(chain));
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
      RETURN_ON_ERROR(
          s.withContext(fmt::format("remove chunks of inode {} on chain {}", ino, chain)));
      for (int i = 0; i < resp.codes_size(); ++i) {
        if (resp.codes(i) != 0) {
          return Status(
              static_cast<ErrorCode>(resp.codes(i)),
              fmt::format("remove chunk {}:{} on chain {}", ino, req.chunks(i).index(), chain));
        }
      }
    }
  }
  return Status::OK();
}

}  // namespace cistern::storage
