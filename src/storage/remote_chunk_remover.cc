#include "storage/remote_chunk_remover.h"

#include <fmt/format.h>

#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include "storage.pb.h"

namespace cistern::storage {

Status RemoteChunkRemover::removeFrom(uint64_t ino, const meta::Layout& layout, uint64_t first) {
  if (layout.chains_size() == 0)
    return Status(ErrorCode::kInvalidArgument, fmt::format("inode {} has no chains", ino));
  if (first > UINT32_MAX) return Status::OK();  // chunk indexes are 32-bit: nothing lies there
  const std::set<uint32_t> distinct(layout.chains().begin(), layout.chains().end());
  const std::vector<uint32_t> chains(distinct.begin(), distinct.end());
  if (chains.size() == 1) return removeOnChain(ino, static_cast<uint32_t>(first), chains[0]);
  // The chains side by side, a bounded number at a time: a truncate waits
  // for about one round trip, not one per chain.
  constexpr size_t kParallel = 8;
  std::vector<Status> results(chains.size());
  for (size_t begin = 0; begin < chains.size(); begin += kParallel) {
    std::vector<std::jthread> running;
    for (size_t i = begin; i < std::min(chains.size(), begin + kParallel); ++i) {
      running.emplace_back(
          [&, i] { results[i] = removeOnChain(ino, static_cast<uint32_t>(first), chains[i]); });
    }
  }
  for (const Status& s : results) RETURN_ON_ERROR(s);
  return Status::OK();
}

Status RemoteChunkRemover::removeOnChain(uint64_t ino, uint32_t first, uint32_t chain) {
  static const net::Method kRemove = net::Method::of("cistern.storage.StorageService.Remove");
  ASSIGN_OR_RETURN(net::Endpoint to, route_(chain));
  RemoveReq req;
  req.set_qos(options_.foreground ? QOS_FOREGROUND : QOS_BACKGROUND);
  req.mutable_from()->set_inode(ino);
  req.mutable_from()->set_index(first);
  req.set_limit(options_.batch);
  for (;;) {
    RemoveResp resp;
    Status s;
    auto backoff = std::chrono::milliseconds(10);
    for (uint32_t attempt = 0;; ++attempt) {
      resp.Clear();
      if (options_.fence) req.set_not_after_unix_ns(options_.fence(to));
      s = client_.callSync(to, kRemove, req, &resp);
      const bool again = s.code() == ErrorCode::kTargetBusy ||
                         (options_.fence && s.code() == ErrorCode::kLeaseExpired);
      if (!again || attempt >= options_.busy_retries) break;
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
    }
    RETURN_ON_ERROR(s.withContext(
        fmt::format("remove chunks of inode {} from {} on chain {}", ino, first, chain)));
    if (!resp.more()) return Status::OK();
  }
}

}  // namespace cistern::storage
