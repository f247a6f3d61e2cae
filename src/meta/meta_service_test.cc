// The metadata service over RPC on loopback and as local calls: results and errno-mapped errors
// travel intact, and a retried request (same client, seq) is answered once.
#include "meta/meta_service.h"
#include "meta/fsck.h"

#include <gtest/gtest.h>

#include "kv/engine.h"
#include "kv/key_codec.h"
#include "kv/kv_test_util.h"
#include "meta/schema.h"
#include "net/rpc_client.h"
#include "tests/support/both_callers.h"

namespace cistern::meta {
namespace {

net::Method m(const char* name) {
  return net::Method::of(std::string("cistern.meta.MetaService.") + name);
}

class MetaServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = kv::openMemEngine();
    ASSERT_TRUE(kv::runTransaction(*engine_, [](kv::Transaction& t) {
                  t.set(chainKey(1), "");
                  return Status::OK();
                }).ok());
    store_ = std::make_unique<MetaStore>(*engine_);
    ASSERT_TRUE(store_->init().ok());
    server_ = std::make_unique<net::RpcServer>(net::ServerOptions{.threads = 1});
    service_ = std::make_unique<MetaService>(*store_, *server_, 4);
    ASSERT_TRUE(server_->start().ok());
    root_.set_uid(0);
  }
  void TearDown() override {
    client_.reset();
    server_->stop();
    service_.reset();
    server_.reset();
    store_.reset();
    engine_.reset();
  }

  template <typename Req, typename Resp>
  Status call(const char* method, const Req& req, Resp* resp) {
    return client_->callSync(server_->endpoint(), m(method), req, resp, {.timeout_ms = 5000});
  }

  std::unique_ptr<kv::Engine> engine_;
  std::unique_ptr<MetaStore> store_;
  std::unique_ptr<net::RpcServer> server_;
  std::unique_ptr<MetaService> service_;
  std::unique_ptr<net::RpcClient> client_ = std::make_unique<net::RpcClient>();
  Caller root_;

  // Idempotency records in the KV.
  size_t countRecords() { return kv::countRows(*engine_, kv::Prefix::kIdempotency); }
};

// Every method runs both ways: over the socket, and on the caller's thread
// (a caller in the server's process, net/local_call.h).
using MetaServiceCallers = testing::BothCallers<MetaServiceTest>;
INSTANTIATE_TEST_SUITE_P(From, MetaServiceCallers, ::testing::Bool(), testing::callerName);

TEST_P(MetaServiceCallers, CreateLookupReaddirUnlinkOverRpc) {
  CreateReq c;
  *c.mutable_caller() = root_;
  c.set_parent(kRootIno);
  c.set_name(std::string("bin\xff\x01name", 9));  // names are bytes, not UTF-8
  c.set_mode(0644);
  c.set_exclusive(true);
  InodeResp created;
  ASSERT_TRUE(call("Create", c, &created).ok());
  EXPECT_EQ(created.inode().type(), REGULAR);

  LookupReq l;
  *l.mutable_caller() = root_;
  l.set_parent(kRootIno);
  l.set_name(c.name());
  InodeResp found;
  ASSERT_TRUE(call("Lookup", l, &found).ok());
  EXPECT_EQ(found.inode().ino(), created.inode().ino());

  ReaddirReq rd;
  *rd.mutable_caller() = root_;
  rd.set_ino(kRootIno);
  rd.set_plus(true);
  ReaddirResp listing;
  ASSERT_TRUE(call("Readdir", rd, &listing).ok());
  ASSERT_EQ(listing.names_size(), 1);
  EXPECT_EQ(listing.names(0), c.name());
  EXPECT_EQ(listing.inodes(0).ino(), created.inode().ino());

  RemoveReq u;
  *u.mutable_caller() = root_;
  u.set_parent(kRootIno);
  u.set_name(c.name());
  Empty e;
  ASSERT_TRUE(call("Unlink", u, &e).ok());
  Status gone = call("Lookup", l, &found);
  EXPECT_EQ(gone.code(), ErrorCode::kNotFound);
  EXPECT_EQ(gone.toErrno(), ENOENT);
}

TEST_P(MetaServiceCallers, ErrorsKeepTheirCodes) {
  MkdirReq mk;
  mk.mutable_caller()->set_uid(1000);
  mk.set_parent(kRootIno);
  mk.set_name("d");
  mk.set_mode(0755);
  InodeResp out;
  EXPECT_EQ(call("Mkdir", mk, &out).code(), ErrorCode::kPermissionDenied);
  mk.mutable_caller()->set_uid(0);
  mk.set_name(std::string(300, 'n'));
  EXPECT_EQ(call("Mkdir", mk, &out).code(), ErrorCode::kNameTooLong);
  GetattrReq g;
  g.set_ino(123456);
  EXPECT_EQ(call("Getattr", g, &out).code(), ErrorCode::kNotFound);
  BatchGetattrReq b;
  b.add_inos(kRootIno);
  b.add_inos(123456);
  BatchGetattrResp br;
  ASSERT_TRUE(call("BatchGetattr", b, &br).ok());
  ASSERT_EQ(br.codes_size(), 2);
  EXPECT_EQ(br.codes(0), 0u);
  EXPECT_EQ(br.codes(1), static_cast<uint32_t>(ErrorCode::kNotFound));
}

TEST_P(MetaServiceCallers, RetriedRequestIsAnsweredOnce) {
  MkdirReq mk;
  *mk.mutable_caller() = root_;
  mk.set_parent(kRootIno);
  mk.set_name("once");
  mk.set_mode(0755);
  mk.set_client("client-7");
  mk.set_seq(41);
  InodeResp first, second;
  ASSERT_TRUE(call("Mkdir", mk, &first).ok());
  if (local()) {
    // A local call's reply cannot be lost: no record is kept, and the same
    // request sent again is a new mkdir.
    EXPECT_EQ(call("Mkdir", mk, &second).code(), ErrorCode::kAlreadyExists);
    EXPECT_EQ(countRecords(), 0u);
    return;
  }
  ASSERT_TRUE(call("Mkdir", mk, &second).ok());  // the reply was "lost"; same request again
  EXPECT_EQ(first.inode().ino(), second.inode().ino());
  EXPECT_EQ(countRecords(), 1u);
  mk.set_seq(42);
  EXPECT_EQ(call("Mkdir", mk, &second).code(), ErrorCode::kAlreadyExists);
}

TEST_P(MetaServiceCallers, CreateWithOpenWriteRecordsOneSessionEvenWhenRetried) {
  CreateReq c;
  *c.mutable_caller() = root_;
  c.set_parent(kRootIno);
  c.set_name("new");
  c.set_mode(0644);
  c.set_client("client-9");
  c.set_seq(1);
  c.set_open_write(true);
  InodeResp first, second;
  ASSERT_TRUE(call("Create", c, &first).ok());
  EXPECT_NE(first.session(), 0u);
  if (!local()) {                                  // (a local call's reply cannot be lost)
    ASSERT_TRUE(call("Create", c, &second).ok());  // lost reply, same request
    EXPECT_EQ(second.session(), first.session());
    EXPECT_EQ(second.inode().ino(), first.inode().ino());
  }
  auto report = fsck(*engine_);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->sessions, 1u);
  // An existing file is returned without a session: the caller opens it.
  c.set_seq(2);
  InodeResp existing;
  ASSERT_TRUE(call("Create", c, &existing).ok());
  EXPECT_EQ(existing.session(), 0u);
  EXPECT_EQ(existing.inode().ino(), first.inode().ino());
  // Closing the session created with the file ends it.
  CloseReq close;
  close.set_ino(first.inode().ino());
  close.set_session(first.session());
  close.set_length(10);
  close.set_wrote(true);
  InodeResp closed;
  ASSERT_TRUE(call("Close", close, &closed).ok());
  EXPECT_EQ(closed.inode().size(), 10u);
  report = fsck(*engine_);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->sessions, 0u);
  EXPECT_TRUE(report->clean());
}

TEST_P(MetaServiceCallers, SetattrXattrsAndOpenClose) {
  CreateReq c;
  *c.mutable_caller() = root_;
  c.set_parent(kRootIno);
  c.set_name("f");
  c.set_mode(0644);
  InodeResp f;
  ASSERT_TRUE(call("Create", c, &f).ok());
  uint64_t ino = f.inode().ino();
  OpenReq o;
  *o.mutable_caller() = root_;
  o.set_ino(ino);
  o.set_write(true);
  OpenResp opened;
  ASSERT_TRUE(call("Open", o, &opened).ok());
  CloseReq cl;
  cl.set_ino(ino);
  cl.set_session(opened.session());
  cl.set_length(4096);
  cl.set_wrote(true);
  InodeResp closed;
  ASSERT_TRUE(call("Close", cl, &closed).ok());
  EXPECT_EQ(closed.inode().size(), 4096u);
  SetattrReq sa;
  *sa.mutable_caller() = root_;
  sa.set_ino(ino);
  sa.set_mode(0600);
  InodeResp changed;
  ASSERT_TRUE(call("Setattr", sa, &changed).ok());
  EXPECT_EQ(changed.inode().mode(), 0600u);
  XattrReq x;
  *x.mutable_caller() = root_;
  x.set_ino(ino);
  x.set_name("user.k");
  x.set_value("v");
  Empty e;
  ASSERT_TRUE(call("SetXattr", x, &e).ok());
  XattrResp got;
  ASSERT_TRUE(call("GetXattr", x, &got).ok());
  EXPECT_EQ(got.value(), "v");
  x.set_name("user.none");
  EXPECT_EQ(call("GetXattr", x, &got).code(), ErrorCode::kNoAttribute);
}

}  // namespace
}  // namespace cistern::meta
