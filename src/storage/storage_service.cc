#include "storage/storage_service.h"

#include <fmt/format.h>

#include "net/blocking.h"
#include "storage.pb.h"

namespace cistern::storage {
namespace {

ChunkId idOf(const ChunkRef& r) { return ChunkId{r.inode(), r.index()}; }

void fill(ChunkInfo* out, const ChunkMeta& m) {
  out->set_length(m.length);
  out->set_chunk_version(m.chunk_version);
  out->set_chain_version(m.chain_version);
  out->set_crc32c(m.crc32c);
  out->set_size_class(m.size_class);
}

net::Method method(const char* name) {
  return net::Method::of(std::string("cistern.storage.StorageService.") + name);
}

}  // namespace

StorageService::StorageService(ChunkEngine& engine, net::RpcServer& server,
                               uint32_t blocking_threads, uint64_t batch_read_bytes_max)
    : engine_(engine), pool_(blocking_threads), batch_read_bytes_max_(batch_read_bytes_max) {
  server.handle<WriteReq, WriteResp>(
      method("Write"),
      [this](net::CallContext& ctx, const WriteReq& req,
             WriteResp& resp) -> asio::awaitable<Status> {
        co_return co_await net::runBlocking(pool_, [&]() -> Status {
          ASSIGN_OR_RETURN(ChunkMeta m, engine_.write(idOf(req.chunk()), req.offset(),
                                                      ctx.requestPayload(), req.chain_version()));
          fill(resp.mutable_info(), m);
          return Status::OK();
        });
      });
  server.handle<BatchReadReq, BatchReadResp>(
      method("BatchRead"),
      [this](net::CallContext& ctx, const BatchReadReq& req,
             BatchReadResp& resp) -> asio::awaitable<Status> {
        uint64_t total = 0;
        for (const auto& r : req.ranges()) total += r.length();
        if (total > batch_read_bytes_max_) {
          co_return Status(
              ErrorCode::kPayloadTooLarge,
              fmt::format("batch read of {} bytes exceeds {}", total, batch_read_bytes_max_));
        }
        auto out = std::make_shared<std::vector<uint8_t>>(total);
        co_return co_await net::runBlocking(pool_, [&]() -> Status {
          size_t at = 0;
          for (const auto& r : req.ranges()) {
            auto n = engine_.read(idOf(r.chunk()), r.offset(),
                                  std::span<uint8_t>(out->data() + at, r.length()));
            resp.add_codes(static_cast<uint32_t>(n.code()));
            size_t got = n.ok() ? *n : 0;
            resp.add_lengths(static_cast<uint32_t>(got));
            at += got;  // the payload carries only the bytes returned
          }
          out->resize(at);
          ctx.setResponsePayload(*out, out);
          return Status::OK();
        });
      });
  server.handle<RemoveReq, RemoveResp>(
      method("Remove"),
      [this](net::CallContext&, const RemoveReq& req, RemoveResp& resp) -> asio::awaitable<Status> {
        co_return co_await net::runBlocking(pool_, [&]() -> Status {
          for (const auto& c : req.chunks())
            resp.add_codes(static_cast<uint32_t>(engine_.remove(idOf(c)).code()));
          return Status::OK();
        });
      });
  server.handle<QueryReq, QueryResp>(
      method("Query"),
      [this](net::CallContext&, const QueryReq& req, QueryResp& resp) -> asio::awaitable<Status> {
        co_return co_await net::runBlocking(pool_, [&]() -> Status {
          ASSIGN_OR_RETURN(auto m, engine_.query(idOf(req.chunk())));
          resp.set_exists(m.has_value());
          if (m) fill(resp.mutable_info(), *m);
          return Status::OK();
        });
      });
}

StorageService::~StorageService() { pool_.join(); }

}  // namespace cistern::storage
