#include "client/remote_chunk_remover.h"

#include <fmt/format.h>

#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include "storage.pb.h"

namespace cistern::client {
namespace {

// Each chain of the layout once, in order (a layout may name one twice).
std::vector<uint32_t> distinctChains(const meta::Layout& layout) {
  const std::set<uint32_t> distinct(layout.chains().begin(), layout.chains().end());
  return {distinct.begin(), distinct.end()};
}

}  // namespace

Status RemoteChunkRemover::removeFrom(uint64_t ino, const meta::Layout& layout, uint64_t first) {
  if (layout.chains_size() == 0)
    return Status(ErrorCode::kInvalidArgument, fmt::format("inode {} has no chains", ino));
  if (first > UINT32_MAX) return Status::OK();  // chunk indexes are 32-bit: nothing lies there
  const std::vector<uint32_t> chains = distinctChains(layout);
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

Status RemoteChunkRemover::retried(const std::function<Status()>& once) {
  auto backoff = std::chrono::milliseconds(10);
  for (uint32_t attempt = 0;; ++attempt) {
    Status s = once();
    const bool moved =
        s.code() == ErrorCode::kStaleChainVersion || s.code() == ErrorCode::kNotServing ||
        s.code() == ErrorCode::kConnectionFailed || s.code() == ErrorCode::kConnectionClosed;
    const bool again = s.code() == ErrorCode::kTargetBusy ||
                       (options_.fence && s.code() == ErrorCode::kLeaseExpired) ||
                       (options_.refresh && moved);
    if (!again || attempt >= options_.busy_retries) return s;
    if (moved) options_.refresh();
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

Status RemoteChunkRemover::removeOnChain(uint64_t ino, uint32_t first, uint32_t chain) {
  static const net::Method kRemove = net::Method::of("cistern.storage.StorageService.Remove");
  storage::RemoveReq req;
  req.set_qos(options_.foreground ? storage::QOS_FOREGROUND : storage::QOS_BACKGROUND);
  req.mutable_from()->set_inode(ino);
  req.mutable_from()->set_index(first);
  req.set_limit(options_.batch);
  for (;;) {
    storage::RemoveResp resp;
    Status s = retried([&] {
      resp.Clear();
      ASSIGN_OR_RETURN(net::Endpoint to, route_(chain));  // again: the routing may move
      if (options_.chain_version) {
        req.set_chain(chain);
        req.set_chain_version(options_.chain_version(chain));
      }
      if (options_.fence) req.set_not_after_unix_ns(options_.fence(to));
      return client_.callSync(to, kRemove, req, &resp, {.credential = options_.credential});
    });
    RETURN_ON_ERROR(s.withContext(
        fmt::format("remove chunks of inode {} from {} on chain {}", ino, first, chain)));
    if (!resp.more()) return Status::OK();
  }
}

Result<uint64_t> RemoteChunkRemover::storedEnd(uint64_t ino, const meta::Layout& layout,
                                               uint64_t first) {
  static const net::Method kList = net::Method::of("cistern.storage.StorageService.List");
  if (layout.chunk_size() == 0 || first > UINT32_MAX) return uint64_t{0};
  uint64_t end = 0;
  for (uint32_t chain : distinctChains(layout)) {
    ASSIGN_OR_RETURN(net::Endpoint to, route_(chain));
    storage::ListReq req;
    req.set_qos(options_.foreground ? storage::QOS_FOREGROUND : storage::QOS_BACKGROUND);
    req.mutable_from()->set_inode(ino);
    req.mutable_from()->set_index(static_cast<uint32_t>(first));
    req.set_limit(options_.batch);
    for (bool more = true; more;) {
      storage::ListResp resp;
      Status s = retried([&] {
        resp.Clear();
        return client_.callSync(to, kList, req, &resp, {.credential = options_.credential});
      });
      RETURN_ON_ERROR(s.withContext(
          fmt::format("list chunks of inode {} from {} on chain {}", ino, first, chain)));
      more = resp.more() && resp.chunks_size() > 0;
      for (const auto& c : resp.chunks()) {
        if (c.chunk().inode() != ino) {
          more = false;  // past the file's chunks
          break;
        }
        end = std::max(end, uint64_t{c.chunk().index()} * layout.chunk_size() + c.info().length());
        if (c.chunk().index() == UINT32_MAX) {
          more = false;
          break;
        }
        req.mutable_from()->set_index(c.chunk().index() + 1);
      }
    }
  }
  return end;
}

}  // namespace cistern::client
