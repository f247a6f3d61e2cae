// Internal to the storage service's .cc files (storage_service.cc,
// storage_chains.cc): request fields to engine types and back.
#pragma once

#include <string>

#include "net/method.h"
#include "storage.pb.h"
#include "storage/chunk_meta.h"

namespace cistern::storage {

inline ChunkId idOf(const ChunkRef& r) { return ChunkId{r.inode(), r.index()}; }

inline void fill(ChunkInfo* out, const ChunkMeta& m) {
  out->set_length(m.length);
  out->set_chunk_version(m.chunk_version);
  out->set_chain_version(m.chain_version);
  out->set_tail_crc(m.tail_crc);
  out->set_size_class(m.size_class);
  out->set_chain(m.chain);
}

inline net::Method method(const char* name) {
  return net::Method::of(std::string("cistern.storage.StorageService.") + name);
}

// What a request without a payload counts against the budget.
inline constexpr uint64_t kRequestBytes = 4096;

}  // namespace cistern::storage
