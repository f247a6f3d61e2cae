// Inline files: a small file's bytes kept in the KV next to its inode, so that
// creating one costs one metadata commit instead of a chunk write and a
// commit, and reading one needs no storage call (docs/meta_kv_schema.md).
//
// Life of an inline file: create (inline_ok) -> the creating session's close
// hands over the bytes (data_inline) -> any later writer, or a truncate past
// inline_max_bytes, moves them to chunk 0 with uninline() -> an ordinary file
// for good. The bytes never change while inline except by truncate (in place,
// setattr.cc) and O_TRUNC (back to an ordinary empty file, open.cc; or an
// empty inline one when a conversion's lease ran out). Chunk 0
// of an inline file holds nothing anyone reads: at most the leftovers of a
// conversion that did not finish, which the next conversion overwrites and
// cuts, and the GC removes with the file.
#include "meta/ops/inline.h"

#include <fmt/format.h>

#include "meta/permission.h"
#include "meta/schema.h"

namespace cistern::meta {

Result<std::string> loadInline(kv::ReadTransaction& t, const Inode& n) {
  if (!n.data_inline()) return std::string();
  ASSIGN_OR_RETURN(auto bytes, t.get(inlineKey(n.ino())));
  if (!bytes || bytes->size() != n.size()) {
    return Status(ErrorCode::kCorruption,
                  fmt::format("inline bytes of inode {}: {} of {} present", n.ino(),
                              bytes ? bytes->size() : 0, n.size()));
  }
  return std::move(*bytes);
}

Status notConverting(const Inode& n, int64_t now_ns) {
  if (n.convert_token() != 0 && n.convert_until_ns() > now_ns) {
    return Status(ErrorCode::kInodeBusy,
                  fmt::format("inode {}: its inline bytes are being moved to chunks", n.ino()));
  }
  return Status::OK();
}

Status takeInline(kv::Transaction& t, Inode& n, uint64_t session, uint64_t length,
                  std::string_view data, uint32_t max_bytes) {
  std::string_view why;
  if (n.type() != REGULAR) {
    why = "not a regular file";
  } else if (session == 0) {
    why = "no write session";
  } else if (!n.inline_ok() || n.data_inline()) {
    why = "another writer or a truncate came first";
  } else if (data.size() != length || length < n.size()) {
    why = "the bytes are not the whole file";
  } else if (length > max_bytes) {
    why = "too large";
  }
  if (!why.empty()) {
    return Status(ErrorCode::kInlineRefused,
                  fmt::format("inode {}: {} bytes not kept inline: {}", n.ino(), length, why));
  }
  t.set(inlineKey(n.ino()), data);
  n.set_data_inline(true);
  n.set_inline_ok(false);
  n.set_size(length);
  return Status::OK();
}

Result<MetaStore::Uninlined> MetaStore::uninline(const Caller& c, uint64_t ino, uint64_t token,
                                                 const RequestId& rid) {
  uint64_t fresh_token = 0;
  if (token == 0) {
    ASSIGN_OR_RETURN(fresh_token, allocator_.next());
  }
  ASSIGN_OR_RETURN(
      std::string bytes, mutate(rid, [&](kv::Transaction& t) -> Result<std::string> {
        ASSIGN_OR_RETURN(Inode n, requireInode(t, ino));
        UninlineResp r;
        int64_t now = nowNs();
        if (!n.data_inline()) {
          *r.mutable_inode() = std::move(n);
          return r.SerializeAsString();
        }
        r.set_was_inline(true);
        if (token == 0) {
          RETURN_ON_ERROR(checkAccess(n, c, kMayWrite));
          RETURN_ON_ERROR(notConverting(n, now));
          ASSIGN_OR_RETURN(*r.mutable_data(), loadInline(t, n));
          n.set_convert_token(fresh_token);
          n.set_convert_until_ns(now + int64_t{options_.inline_convert_lease_ms} * 1'000'000);
          r.set_token(fresh_token);
        } else {
          if (n.convert_token() != token) {
            return Status(ErrorCode::kInlineRefused,
                          fmt::format("inode {}: the conversion lease was lost; begin again", ino));
          }
          t.clear(inlineKey(ino));
          n.set_data_inline(false);
          n.set_convert_token(0);
          n.set_convert_until_ns(0);
          r.set_token(token);
        }
        storeInode(t, n);
        *r.mutable_inode() = std::move(n);
        return r.SerializeAsString();
      }));
  UninlineResp r;
  if (!r.ParseFromString(bytes))
    return Status(ErrorCode::kCorruption, fmt::format("uninline result of {} does not parse", ino));
  return Uninlined{r.was_inline(), std::move(*r.mutable_data()), r.token(),
                   std::move(*r.mutable_inode())};
}

}  // namespace cistern::meta
