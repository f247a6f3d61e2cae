// Internal to the operations that touch inline files: small regular files
// whose bytes live in the KV under (kInlineData, ino) instead of in chunks.
#pragma once

#include <string>
#include <string_view>

#include "meta/meta_store.h"

namespace cistern::meta {

// The largest inline file any configuration allows: the smallest chunk size.
inline constexpr uint32_t kInlineMaxBytesLimit = 64u << 10;

// The bytes of `n` when it is data_inline, else empty.
Result<std::string> loadInline(kv::ReadTransaction& t, const Inode& n);

// kInodeBusy while a client holds `n` to convert it (the caller retries).
Status notConverting(const Inode& n, int64_t now_ns);

// close() handing over the whole file: keeps `data` inline in `n` (stored by
// the caller) when the creating session may (inline_ok) and it fits
// `max_bytes`; kInlineRefused otherwise.
Status takeInline(kv::Transaction& t, Inode& n, uint64_t session, uint64_t length,
                  std::string_view data, uint32_t max_bytes);

}  // namespace cistern::meta
