#include "meta/meta_service.h"

#include "meta/permission.h"
#include "net/blocking.h"

namespace cistern::meta {
namespace {

// Set while a call from this process runs (handleLocal): its reply cannot be
// lost on the way, so its mutation needs no idempotency record — one key less
// per commit, and the KV does not keep a record per file the mount creates.
thread_local bool t_local_call = false;

RequestId rid(const std::string& client, uint64_t seq) {
  if (t_local_call) return RequestId{};
  return RequestId{client, seq};
}

template <typename T>
Status into(Result<T> r, T* out) {
  RETURN_ON_ERROR(r);
  *out = std::move(r).value();
  return Status::OK();
}

}  // namespace

template <typename Req, typename Resp>
void MetaService::add(const char* method, std::function<Status(const Req&, Resp&)> fn,
                      std::function<bool(const Req&)> inline_if) {
  net::Method m = net::Method::of(std::string("cistern.meta.MetaService.") + method);
  server_.handle<Req, Resp>(
      m,
      [this, fn, inline_if = std::move(inline_if)](net::CallContext&, const Req& req,
                                                   Resp& resp) -> asio::awaitable<Status> {
        if (gate_) {
          if (Status g = gate_(); !g.ok()) co_return g;
        }
        if (inline_reads_ && inline_if && inline_if(req)) co_return fn(req, resp);
        co_return co_await net::runBlocking(pool_, [&] { return fn(req, resp); });
      });
  // A caller in this process (the FUSE mount of `cistern up --mount`) runs
  // the operation on its own thread, which may block.
  server_.handleLocal(
      m, [fn = std::move(fn)](const google::protobuf::Message& req, google::protobuf::Message& resp,
                              net::LocalPayloads&) {
        struct Local {
          Local() { t_local_call = true; }
          ~Local() { t_local_call = false; }
        } local;
        return fn(static_cast<const Req&>(req), static_cast<Resp&>(resp));
      });
}

template <typename Req, typename Resp>
void MetaService::addRead(const char* method, std::function<Status(const Req&, Resp&)> fn) {
  add<Req, Resp>(method, std::move(fn), [](const Req&) { return true; });
}

MetaService::MetaService(MetaStore& store, net::RpcServer& server, uint32_t blocking_threads,
                         bool inline_reads)
    : store_(store), server_(server), pool_(blocking_threads), inline_reads_(inline_reads) {
  MetaStore& s = store_;
  addRead<LookupReq, InodeResp>("Lookup", [&s](const LookupReq& r, InodeResp& out) {
    return into(s.lookup(r.caller(), r.parent(), r.name()), out.mutable_inode());
  });
  addRead<GetattrReq, InodeResp>("Getattr", [&s](const GetattrReq& r, InodeResp& out) {
    ASSIGN_OR_RETURN(*out.mutable_inode(), s.getattr(r.ino()));
    if (r.access_mask() == 0) return Status::OK();
    return checkAccess(out.inode(), r.caller(), static_cast<int>(r.access_mask()));
  });
  add<BatchGetattrReq, BatchGetattrResp>(
      "BatchGetattr", [&s](const BatchGetattrReq& r, BatchGetattrResp& out) {
        auto all = s.batchGetattr({r.inos().begin(), r.inos().end()});
        for (auto& one : all) {
          out.add_codes(static_cast<uint32_t>(one.code()));
          *out.add_inodes() = one.ok() ? std::move(one).value() : Inode();
        }
        return Status::OK();
      });
  add<MkdirReq, InodeResp>("Mkdir", [&s](const MkdirReq& r, InodeResp& out) {
    return into(s.mkdir(r.caller(), r.parent(), r.name(), r.mode(), rid(r.client(), r.seq())),
                out.mutable_inode());
  });
  add<CreateReq, InodeResp>("Create", [&s](const CreateReq& r, InodeResp& out) -> Status {
    const RequestId id = rid(r.client(), r.seq());
    ASSIGN_OR_RETURN(auto o, r.open_write() ? s.createOpen(r.caller(), r.parent(), r.name(),
                                                           r.mode(), r.exclusive(), r.client(), id)
                                            : s.createFile(r.caller(), r.parent(), r.name(),
                                                           r.mode(), r.exclusive(), id));
    *out.mutable_inode() = std::move(o.inode);
    out.set_session(o.session);
    out.set_created(o.created);
    return Status::OK();
  });
  add<RemoveReq, Empty>("Unlink", [&s](const RemoveReq& r, Empty&) {
    return s.unlink(r.caller(), r.parent(), r.name(), rid(r.client(), r.seq()));
  });
  add<RemoveReq, Empty>("Rmdir", [&s](const RemoveReq& r, Empty&) {
    return s.rmdir(r.caller(), r.parent(), r.name(), rid(r.client(), r.seq()));
  });
  add<RenameReq, Empty>("Rename", [&s](const RenameReq& r, Empty&) {
    return s.rename(r.caller(), r.src_parent(), r.src_name(), r.dst_parent(), r.dst_name(),
                    r.flags(), rid(r.client(), r.seq()));
  });
  add<LinkReq, InodeResp>("Link", [&s](const LinkReq& r, InodeResp& out) {
    return into(s.link(r.caller(), r.ino(), r.new_parent(), r.new_name(), rid(r.client(), r.seq())),
                out.mutable_inode());
  });
  add<SymlinkReq, InodeResp>("Symlink", [&s](const SymlinkReq& r, InodeResp& out) {
    return into(s.symlink(r.caller(), r.parent(), r.name(), r.target(), rid(r.client(), r.seq())),
                out.mutable_inode());
  });
  add<MknodReq, InodeResp>("Mknod", [&s](const MknodReq& r, InodeResp& out) {
    return into(s.mknod(r.caller(), r.parent(), r.name(), r.type(), r.mode(), r.rdev(),
                        rid(r.client(), r.seq())),
                out.mutable_inode());
  });
  addRead<GetattrReq, ReadlinkResp>("Readlink", [&s](const GetattrReq& r, ReadlinkResp& out) {
    return into(s.readlink(r.ino()), out.mutable_target());
  });
  add<SetattrReq, InodeResp>("Setattr", [&s](const SetattrReq& r, InodeResp& out) {
    SetAttr a;
    if (r.has_mode()) a.mode = r.mode();
    if (r.has_uid()) a.uid = r.uid();
    if (r.has_gid()) a.gid = r.gid();
    if (r.has_size()) a.size = r.size();
    if (r.has_atime_ns()) a.atime_ns = r.atime_ns();
    if (r.has_mtime_ns()) a.mtime_ns = r.mtime_ns();
    a.atime_now = r.atime_now();
    a.mtime_now = r.mtime_now();
    return into(s.setattr(r.caller(), r.ino(), a, rid(r.client(), r.seq())), out.mutable_inode());
  });
  addRead<ReaddirReq, ReaddirResp>("Readdir", [&s](const ReaddirReq& r, ReaddirResp& out) {
    ASSIGN_OR_RETURN(DirListing l, s.readdir(r.caller(), r.ino(), r.cookie(), r.limit(), r.plus()));
    for (auto& e : l.entries) {
      out.add_names(std::move(e.name));
      *out.add_entries() = std::move(e.entry);
      if (r.plus()) *out.add_inodes() = std::move(e.inode);
    }
    out.set_next_cookie(std::move(l.next_cookie));
    return Status::OK();
  });
  addRead<AccessReq, Empty>("Access", [&s](const AccessReq& r, Empty&) {
    return s.access(r.caller(), r.ino(), static_cast<int>(r.mask()));
  });
  add<OpenReq, OpenResp>(
      "Open",
      [&s](const OpenReq& r, OpenResp& out) {
        ASSIGN_OR_RETURN(auto opened, s.open(r.caller(), r.ino(), r.read(), r.write(), r.truncate(),
                                             r.client(), rid(r.client(), r.seq()), r.hold()));
        *out.mutable_inode() = std::move(opened.inode);
        out.set_session(opened.session);
        out.set_inline_data(std::move(opened.inline_data));
        return Status::OK();
      },
      // Without write or hold, MetaStore::open is a read-only transaction.
      [](const OpenReq& r) { return !r.write() && !r.hold(); });
  add<CloseReq, InodeResp>("Close", [&s](const CloseReq& r, InodeResp& out) {
    std::optional<std::string> inline_data;
    if (r.has_inline_data()) inline_data = r.inline_data();
    return into(s.close(r.ino(), r.session(), r.length(), r.wrote(), rid(r.client(), r.seq()),
                        inline_data, r.sync()),
                out.mutable_inode());
  });
  add<Empty, Empty>("Sync", [&s](const Empty&, Empty&) { return s.sync(); });
  add<UninlineReq, UninlineResp>("Uninline", [&s](const UninlineReq& r, UninlineResp& out) {
    ASSIGN_OR_RETURN(auto u, s.uninline(r.caller(), r.ino(), r.token(), rid(r.client(), r.seq())));
    out.set_was_inline(u.was_inline);
    out.set_data(std::move(u.data));
    out.set_token(u.token);
    *out.mutable_inode() = std::move(u.inode);
    return Status::OK();
  });
  add<RenewReq, Empty>("Renew",
                       [&s](const RenewReq& r, Empty&) { return s.renewClient(r.client()); });
  add<XattrReq, Empty>("SetXattr", [&s](const XattrReq& r, Empty&) {
    return s.setxattr(r.caller(), r.ino(), r.name(), r.value(), r.flags(),
                      rid(r.client(), r.seq()));
  });
  addRead<XattrReq, XattrResp>("GetXattr", [&s](const XattrReq& r, XattrResp& out) {
    return into(s.getxattr(r.caller(), r.ino(), r.name()), out.mutable_value());
  });
  addRead<XattrReq, XattrResp>("ListXattr", [&s](const XattrReq& r, XattrResp& out) {
    ASSIGN_OR_RETURN(auto names, s.listxattr(r.caller(), r.ino()));
    for (auto& n : names) out.add_names(std::move(n));
    return Status::OK();
  });
  addRead<Empty, StatfsResp>("Statfs", [&s](const Empty&, StatfsResp& out) {
    ASSIGN_OR_RETURN(StatFs st, s.statfs());
    out.set_inodes_used(st.inodes_used);
    out.set_bytes_total(st.bytes_total);
    out.set_bytes_free(st.bytes_free);
    out.set_capacity_known(st.capacity_known);
    out.set_block_size(st.block_size);
    out.set_name_max(st.name_max);
    return Status::OK();
  });
  add<XattrReq, Empty>("RemoveXattr", [&s](const XattrReq& r, Empty&) {
    return s.removexattr(r.caller(), r.ino(), r.name(), rid(r.client(), r.seq()));
  });
}

MetaService::~MetaService() { pool_.join(); }

}  // namespace cistern::meta
