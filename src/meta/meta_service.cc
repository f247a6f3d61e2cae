#include "meta/meta_service.h"

#include <fmt/format.h>

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

// ---------------------------------------------------------------------------
// Authorization (authorizer.h): per request type, the inodes it names (each
// turned into the real one, inside the caller's tenant) and its caller
// (mapped); per response type, real inode numbers turned back into the
// caller's view (its root is 1). A request type without a scope() does not
// compile: no method can skip the check.

// The principal of the call running on this thread (null: no checks).
thread_local const Principal* t_principal = nullptr;

class Scope {
 public:
  Scope(Authorizer& a, const Principal& p) : a_(a), p_(p) {}
  void caller(Caller* c) { a_.mapCaller(p_, c); }
  bool isRoot(uint64_t real_ino) const { return p_.confined() && real_ino == p_.root; }
  uint64_t ino(uint64_t v) {
    if (!status.ok()) return v;
    Result<uint64_t> r = a_.inodeIn(p_, v);
    if (!r.ok()) {
      status = r.status();
      return v;
    }
    return *r;
  }
  Status status;

 private:
  Authorizer& a_;
  const Principal& p_;
};

void scope(LookupReq& r, Scope& s) {
  s.caller(r.mutable_caller());
  r.set_parent(s.ino(r.parent()));
  // The root's ".." is the root, as for /: not the directory above it.
  if (r.name() == ".." && s.isRoot(r.parent())) r.set_name(".");
}
void scope(GetattrReq& r, Scope& s) {
  s.caller(r.mutable_caller());
  r.set_ino(s.ino(r.ino()));
}
void scope(BatchGetattrReq& r, Scope& s) {
  for (auto& ino : *r.mutable_inos()) ino = s.ino(ino);
}
void scope(MkdirReq& r, Scope& s) {
  s.caller(r.mutable_caller());
  r.set_parent(s.ino(r.parent()));
}
void scope(CreateReq& r, Scope& s) {
  s.caller(r.mutable_caller());
  r.set_parent(s.ino(r.parent()));
}
void scope(RemoveReq& r, Scope& s) {
  s.caller(r.mutable_caller());
  r.set_parent(s.ino(r.parent()));
}
void scope(RenameReq& r, Scope& s) {
  s.caller(r.mutable_caller());
  r.set_src_parent(s.ino(r.src_parent()));
  r.set_dst_parent(s.ino(r.dst_parent()));
}
void scope(LinkReq& r, Scope& s) {
  s.caller(r.mutable_caller());
  r.set_ino(s.ino(r.ino()));
  r.set_new_parent(s.ino(r.new_parent()));
}
void scope(SymlinkReq& r, Scope& s) {
  s.caller(r.mutable_caller());
  r.set_parent(s.ino(r.parent()));
}
void scope(MknodReq& r, Scope& s) {
  s.caller(r.mutable_caller());
  r.set_parent(s.ino(r.parent()));
}
void scope(SetattrReq& r, Scope& s) {
  s.caller(r.mutable_caller());
  r.set_ino(s.ino(r.ino()));
}
void scope(ReaddirReq& r, Scope& s) {
  s.caller(r.mutable_caller());
  r.set_ino(s.ino(r.ino()));
}
void scope(AccessReq& r, Scope& s) {
  s.caller(r.mutable_caller());
  r.set_ino(s.ino(r.ino()));
}
void scope(OpenReq& r, Scope& s) {
  s.caller(r.mutable_caller());
  r.set_ino(s.ino(r.ino()));
}
void scope(CloseReq& r, Scope& s) { r.set_ino(s.ino(r.ino())); }
void scope(UninlineReq& r, Scope& s) {
  s.caller(r.mutable_caller());
  r.set_ino(s.ino(r.ino()));
}
void scope(XattrReq& r, Scope& s) {
  s.caller(r.mutable_caller());
  r.set_ino(s.ino(r.ino()));
}
void scope(TenantCreateReq& r, Scope& s) {
  s.caller(r.mutable_caller());
  r.set_parent(s.ino(r.parent()));
}
void scope(CapabilityReq& r, Scope& s) {
  s.caller(r.mutable_caller());
  r.set_ino(s.ino(r.ino()));
}
void scope(StatfsReq& r, Scope& s) { r.set_ino(s.ino(r.ino() == 0 ? 1 : r.ino())); }
void scope(QuotaSetReq& r, Scope& s) { r.set_ino(s.ino(r.ino())); }
void scope(QuotaReq& r, Scope& s) { r.set_ino(s.ino(r.ino())); }
void scope(ReserveReq& r, Scope& s) { r.set_ino(s.ino(r.ino())); }
void scope(RenewReq&, Scope&) {}
void scope(Empty&, Scope&) {}
void scope(TenantReq&, Scope&) {}
void scope(RevokeReq&, Scope&) {}

void unmap(Inode& n, uint64_t root) {
  if (n.ino() == root) {
    n.set_ino(1);
    n.set_parent(1);
  } else if (n.parent() == root) {
    n.set_parent(1);
  }
}
void unmapResp(InodeResp& r, uint64_t root) { unmap(*r.mutable_inode(), root); }
void unmapResp(QuotaResp& r, uint64_t root) {
  if (r.ino() == root) r.set_ino(1);
}
void unmapResp(QuotaListResp& r, uint64_t root) {
  for (auto& q : *r.mutable_quotas()) unmapResp(q, root);
}
void unmapResp(OpenResp& r, uint64_t root) { unmap(*r.mutable_inode(), root); }
void unmapResp(UninlineResp& r, uint64_t root) { unmap(*r.mutable_inode(), root); }
void unmapResp(BatchGetattrResp& r, uint64_t root) {
  for (auto& n : *r.mutable_inodes()) unmap(n, root);
}
void unmapResp(ReaddirResp& r, uint64_t root) {
  for (auto& n : *r.mutable_inodes()) unmap(n, root);
  for (auto& e : *r.mutable_entries()) {
    if (e.ino() == root) e.set_ino(1);
  }
}
template <typename Resp>
void unmapResp(Resp&, uint64_t) {}  // no inode in it

Need needOf(const OpenReq& r, Need) {
  return r.write() || r.truncate() || r.hold() ? Need::kWrite : Need::kRead;
}
Need needOf(const CapabilityReq& r, Need) { return r.write() ? Need::kWrite : Need::kRead; }
Need needOf(const CloseReq& r, Need) {
  return r.wrote() || r.has_inline_data() ? Need::kWrite : Need::kRead;
}
template <typename Req>
Need needOf(const Req&, Need need) {
  return need;
}

// A capability for the call's principal over `ino` (empty: no checks).
Result<std::string> capabilityFor(Authorizer* a, uint64_t ino, uint32_t rights) {
  if (!a || !t_principal) return std::string();
  return a->capability(*t_principal, ino, rights);
}

}  // namespace

template <typename Req, typename Resp>
Status MetaService::authorized(std::string_view credential, Need need,
                               const std::function<Status(const Req&, Resp&)>& fn, const Req& req,
                               Resp& resp) {
  if (!authz_) return fn(req, resp);
  ASSIGN_OR_RETURN(Principal p, authz_->authenticate(credential, needOf(req, need)));
  Req mine = req;
  Scope sc(*authz_, p);
  scope(mine, sc);
  RETURN_ON_ERROR(sc.status);
  struct Bind {
    explicit Bind(const Principal* p) { t_principal = p; }
    ~Bind() { t_principal = nullptr; }
  } bind(&p);
  Status s = fn(mine, resp);
  if (s.ok() && p.confined()) unmapResp(resp, p.root);
  return s;
}

template <typename Req, typename Resp>
void MetaService::add(const char* method, Need need, std::function<Status(const Req&, Resp&)> fn,
                      std::function<bool(const Req&)> inline_if) {
  net::Method m = net::Method::of(std::string("cistern.meta.MetaService.") + method);
  server_.handle<Req, Resp>(
      m,
      [this, fn, need, inline_if = std::move(inline_if)](net::CallContext& ctx, const Req& req,
                                                         Resp& resp) -> asio::awaitable<Status> {
        if (gate_) {
          if (Status g = gate_(); !g.ok()) co_return g;
        }
        const std::string& cred = ctx.credential();
        if (inline_reads_ && inline_if && inline_if(req))
          co_return authorized(cred, need, fn, req, resp);
        co_return co_await net::runBlocking(pool_,
                                            [&] { return authorized(cred, need, fn, req, resp); });
      });
  // A caller in this process (the FUSE mount of `cistern up --mount`) runs
  // the operation on its own thread, which may block.
  server_.handleLocal(
      m, [this, fn = std::move(fn), need](const google::protobuf::Message& req,
                                          google::protobuf::Message& resp, net::LocalPayloads& p) {
        struct Local {
          Local() { t_local_call = true; }
          ~Local() { t_local_call = false; }
        } local;
        return authorized(p.credential, need, fn, static_cast<const Req&>(req),
                          static_cast<Resp&>(resp));
      });
}

template <typename Req, typename Resp>
void MetaService::addRead(const char* method, std::function<Status(const Req&, Resp&)> fn) {
  add<Req, Resp>(method, Need::kRead, std::move(fn), [](const Req&) { return true; });
}

MetaService::MetaService(MetaStore& store, net::RpcServer& server, uint32_t blocking_threads,
                         bool inline_reads)
    : store_(store), server_(server), pool_(blocking_threads), inline_reads_(inline_reads) {
  MetaStore& s = store_;
  addRead<LookupReq, InodeResp>("Lookup", [&s](const LookupReq& r, InodeResp& out) {
    return into(s.lookup(r.caller(), r.parent(), r.name()), out.mutable_inode());
  });
  addRead<GetattrReq, InodeResp>("Getattr", [&s, this](const GetattrReq& r, InodeResp& out) {
    ASSIGN_OR_RETURN(*out.mutable_inode(), s.getattr(r.ino()));
    if (r.access_mask() == 0) return Status::OK();
    RETURN_ON_ERROR(checkAccess(out.inode(), r.caller(), static_cast<int>(r.access_mask())));
    if ((r.access_mask() & kMayWrite) && out.inode().type() == REGULAR) {
      // A truncate: the caller cuts the file's chunks next.
      ASSIGN_OR_RETURN(*out.mutable_capability(),
                       capabilityFor(authz_, r.ino(), auth::kRead | auth::kWrite));
    }
    return Status::OK();
  });
  add<BatchGetattrReq, BatchGetattrResp>(
      "BatchGetattr", Need::kRead, [&s](const BatchGetattrReq& r, BatchGetattrResp& out) {
        auto all = s.batchGetattr({r.inos().begin(), r.inos().end()});
        for (auto& one : all) {
          out.add_codes(static_cast<uint32_t>(one.code()));
          *out.add_inodes() = one.ok() ? std::move(one).value() : Inode();
        }
        return Status::OK();
      });
  add<MkdirReq, InodeResp>("Mkdir", Need::kWrite, [&s](const MkdirReq& r, InodeResp& out) {
    return into(s.mkdir(r.caller(), r.parent(), r.name(), r.mode(), rid(r.client(), r.seq())),
                out.mutable_inode());
  });
  add<CreateReq, InodeResp>(
      "Create", Need::kWrite, [&s, this](const CreateReq& r, InodeResp& out) -> Status {
        const RequestId id = rid(r.client(), r.seq());
        ASSIGN_OR_RETURN(auto o, r.open_write()
                                     ? s.createOpen(r.caller(), r.parent(), r.name(), r.mode(),
                                                    r.exclusive(), r.client(), id)
                                     : s.createFile(r.caller(), r.parent(), r.name(), r.mode(),
                                                    r.exclusive(), id));
        *out.mutable_inode() = std::move(o.inode);
        out.set_session(o.session);
        out.set_created(o.created);
        if (o.session != 0) {
          ASSIGN_OR_RETURN(*out.mutable_capability(),
                           capabilityFor(authz_, out.inode().ino(), auth::kRead | auth::kWrite));
          ASSIGN_OR_RETURN(auto q, s.reservation(out.inode().ino()));
          out.set_under_quota(q.under_quota);
          out.set_reserve_to(q.reserve_to);
        }
        return Status::OK();
      });
  add<RemoveReq, Empty>("Unlink", Need::kWrite, [&s](const RemoveReq& r, Empty&) {
    return s.unlink(r.caller(), r.parent(), r.name(), rid(r.client(), r.seq()));
  });
  add<RemoveReq, Empty>("Rmdir", Need::kWrite, [&s](const RemoveReq& r, Empty&) {
    return s.rmdir(r.caller(), r.parent(), r.name(), rid(r.client(), r.seq()));
  });
  add<RenameReq, Empty>("Rename", Need::kWrite, [&s](const RenameReq& r, Empty&) {
    return s.rename(r.caller(), r.src_parent(), r.src_name(), r.dst_parent(), r.dst_name(),
                    r.flags(), rid(r.client(), r.seq()));
  });
  add<LinkReq, InodeResp>("Link", Need::kWrite, [&s](const LinkReq& r, InodeResp& out) {
    return into(s.link(r.caller(), r.ino(), r.new_parent(), r.new_name(), rid(r.client(), r.seq())),
                out.mutable_inode());
  });
  add<SymlinkReq, InodeResp>("Symlink", Need::kWrite, [&s](const SymlinkReq& r, InodeResp& out) {
    return into(s.symlink(r.caller(), r.parent(), r.name(), r.target(), rid(r.client(), r.seq())),
                out.mutable_inode());
  });
  add<MknodReq, InodeResp>("Mknod", Need::kWrite, [&s](const MknodReq& r, InodeResp& out) {
    return into(s.mknod(r.caller(), r.parent(), r.name(), r.type(), r.mode(), r.rdev(),
                        rid(r.client(), r.seq())),
                out.mutable_inode());
  });
  addRead<GetattrReq, ReadlinkResp>("Readlink", [&s](const GetattrReq& r, ReadlinkResp& out) {
    return into(s.readlink(r.ino()), out.mutable_target());
  });
  add<SetattrReq, InodeResp>("Setattr", Need::kWrite, [&s](const SetattrReq& r, InodeResp& out) {
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
      "Open", Need::kRead,
      [&s, this](const OpenReq& r, OpenResp& out) {
        ASSIGN_OR_RETURN(auto opened, s.open(r.caller(), r.ino(), r.read(), r.write(), r.truncate(),
                                             r.client(), rid(r.client(), r.seq()), r.hold()));
        *out.mutable_inode() = std::move(opened.inode);
        out.set_session(opened.session);
        out.set_inline_data(std::move(opened.inline_data));
        const uint32_t rights =
            (r.read() ? auth::kRead : 0) | (r.write() || r.truncate() ? auth::kWrite : 0);
        ASSIGN_OR_RETURN(*out.mutable_capability(),
                         capabilityFor(authz_, out.inode().ino(), rights | auth::kRead));
        if (out.session() != 0 && out.inode().type() == REGULAR) {
          ASSIGN_OR_RETURN(auto q, s.reservation(out.inode().ino()));
          out.set_under_quota(q.under_quota);
          out.set_reserve_to(q.reserve_to);
        }
        return Status::OK();
      },
      // Without write or hold, MetaStore::open is a read-only transaction.
      [](const OpenReq& r) { return !r.write() && !r.hold(); });
  add<CloseReq, InodeResp>("Close", Need::kRead, [&s](const CloseReq& r, InodeResp& out) {
    std::optional<std::string> inline_data;
    if (r.has_inline_data()) inline_data = r.inline_data();
    return into(s.close(r.ino(), r.session(), r.length(), r.wrote(), rid(r.client(), r.seq()),
                        inline_data, r.sync()),
                out.mutable_inode());
  });
  add<Empty, Empty>("Sync", Need::kRead, [&s](const Empty&, Empty&) { return s.sync(); });
  add<UninlineReq, UninlineResp>(
      "Uninline", Need::kWrite, [&s](const UninlineReq& r, UninlineResp& out) {
        ASSIGN_OR_RETURN(auto u,
                         s.uninline(r.caller(), r.ino(), r.token(), rid(r.client(), r.seq())));
        out.set_was_inline(u.was_inline);
        out.set_data(std::move(u.data));
        out.set_token(u.token);
        *out.mutable_inode() = std::move(u.inode);
        return Status::OK();
      });
  add<RenewReq, Empty>("Renew", Need::kRead,
                       [&s](const RenewReq& r, Empty&) { return s.renewClient(r.client()); });
  add<XattrReq, Empty>("SetXattr", Need::kWrite, [&s](const XattrReq& r, Empty&) {
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
  addRead<StatfsReq, StatfsResp>("Statfs", [&s](const StatfsReq& r, StatfsResp& out) {
    ASSIGN_OR_RETURN(StatFs st, s.statfs(r.ino()));
    out.set_inodes_used(st.inodes_used);
    out.set_inodes_total(st.inodes_total);
    out.set_bytes_total(st.bytes_total);
    out.set_bytes_free(st.bytes_free);
    out.set_capacity_known(st.capacity_known);
    out.set_block_size(st.block_size);
    out.set_name_max(st.name_max);
    return Status::OK();
  });
  add<XattrReq, Empty>("RemoveXattr", Need::kWrite, [&s](const XattrReq& r, Empty&) {
    return s.removexattr(r.caller(), r.ino(), r.name(), rid(r.client(), r.seq()));
  });
  addAdmin();
}

MetaService::~MetaService() { pool_.join(); }

void MetaService::addAdmin() {
  MetaStore& s = store_;
  add<TenantCreateReq, TenantResp>(
      "TenantCreate", Need::kAdmin, [&s, this](const TenantCreateReq& r, TenantResp& out) {
        RETURN_ON_ERROR(into(s.createTenant(r.caller(), r.parent(), r.name(), r.tenant(), r.mode(),
                                            r.uid(), r.gid()),
                             out.mutable_tenant()));
        if (authz_) authz_->tenantCreated(out.tenant());
        return Status::OK();
      });
  add<Empty, TenantListResp>("TenantList", Need::kAdmin,
                             [&s](const Empty&, TenantListResp& out) -> Status {
                               ASSIGN_OR_RETURN(auto all, s.listTenants());
                               for (auto& t : all) *out.add_tenants() = std::move(t);
                               return Status::OK();
                             });
  add<TenantReq, Empty>("TenantRemove", Need::kAdmin,
                        [&s](const TenantReq& r, Empty&) { return s.removeTenant(r.tenant()); });
  add<RevokeReq, Empty>("RevokeToken", Need::kAdmin, [&s](const RevokeReq& r, Empty&) {
    if (r.token_id() == 0) return Status(ErrorCode::kInvalidArgument, "token id 0");
    return s.revokeToken(r.token_id(), r.expires_unix_s());
  });
  add<CapabilityReq, CapabilityResp>(
      "Capability", Need::kRead,
      [&s, this](const CapabilityReq& r, CapabilityResp& out) -> Status {
        if (!authz_) return Status::OK();
        ASSIGN_OR_RETURN(Inode n, s.getattr(r.ino()));
        if (n.type() != REGULAR)
          return Status(ErrorCode::kInvalidArgument,
                        fmt::format("inode {} is not a file", r.ino()));
        RETURN_ON_ERROR(checkAccess(n, r.caller(), r.write() ? kMayWrite : kMayRead));
        ASSIGN_OR_RETURN(
            *out.mutable_capability(),
            capabilityFor(authz_, r.ino(), auth::kRead | (r.write() ? auth::kWrite : 0)));
        return Status::OK();
      },
      [](const CapabilityReq&) { return true; });
  auto fill = [](const MetaStore::QuotaInfo& q, QuotaResp& out) {
    out.set_ino(q.dir);
    *out.mutable_quota() = q.quota;
    out.set_bytes_used(static_cast<uint64_t>(std::max<int64_t>(q.bytes_used, 0)));
    out.set_inodes_used(static_cast<uint64_t>(std::max<int64_t>(q.inodes_used, 0)));
  };
  add<QuotaSetReq, QuotaResp>(
      "QuotaSet", Need::kTenantAdmin, [&s, fill](const QuotaSetReq& r, QuotaResp& out) -> Status {
        // A tenant's admin sets quotas inside its subtree; its own is the cluster's.
        if (t_principal && t_principal->confined() && r.ino() == t_principal->root) {
          Authorizer::countRefusal(ErrorCode::kTokenNotAdmin);
          return Status(ErrorCode::kTokenNotAdmin,
                        fmt::format("the quota of tenant {}'s root is the cluster admin's to set",
                                    t_principal->tenant));
        }
        ASSIGN_OR_RETURN(auto q, s.setQuota(r.ino(), r.bytes_max(), r.inodes_max()));
        fill(q, out);
        return Status::OK();
      });
  addRead<QuotaReq, QuotaResp>("QuotaGet", [&s, fill](const QuotaReq& r, QuotaResp& out) -> Status {
    ASSIGN_OR_RETURN(auto q, s.getQuota(r.ino()));
    fill(q, out);
    return Status::OK();
  });
  add<Empty, QuotaListResp>("QuotaList", Need::kRead,
                            [&s, fill, this](const Empty&, QuotaListResp& out) -> Status {
                              ASSIGN_OR_RETURN(auto all, s.listQuotas());
                              for (const auto& q : all) {
                                // A tenant sees the quotas of its own subtree.
                                if (authz_ && t_principal && !authz_->owns(*t_principal, q.dir))
                                  continue;
                                fill(q, *out.add_quotas());
                              }
                              return Status::OK();
                            });
  add<ReserveReq, ReserveResp>("Reserve", Need::kWrite,
                               [&s](const ReserveReq& r, ReserveResp& out) -> Status {
                                 ASSIGN_OR_RETURN(auto q, s.reserve(r.ino(), r.session(), r.end()));
                                 out.set_under_quota(q.under_quota);
                                 out.set_reserve_to(q.reserve_to);
                                 return Status::OK();
                               });
  add<Empty, WhoAmIResp>("WhoAmI", Need::kRead, [](const Empty&, WhoAmIResp& out) {
    if (!t_principal) return Status::OK();
    out.set_auth(true);
    out.set_tenant(t_principal->tenant);
    out.set_uid(t_principal->uid);
    out.set_gid(t_principal->gid);
    out.set_rights(t_principal->rights);
    out.set_expires_unix_s(t_principal->expires_unix_s);
    out.set_token_id(t_principal->token_id);
    return Status::OK();
  });
}

}  // namespace cistern::meta
