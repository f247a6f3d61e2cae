// Local calls (net/local_call.h): a caller in the server's process runs the
// handler on its own thread with its own buffers; failures, throws and stop.
#include <gtest/gtest.h>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/crc32c.h"
#include "common/metrics.h"
#include "net/local_call.h"
#include "net/rpc_client.h"
#include "net/rpc_server.h"
#include "net/rpc_test_util.h"

namespace cistern::net {
namespace {

using namespace test_util;

// A server whose Echo also has a local handler, which notes its thread and
// can be held inside by `gate`.
struct LocalEchoServer {
  std::atomic<std::thread::id> local_thread{};
  std::atomic<int> local_calls{0};
  std::atomic<bool> hold{false};
  std::mutex mu;
  std::condition_variable cv;
  bool inside = false, released = false;
  RpcServer server{ServerOptions{.threads = 1}};

  LocalEchoServer() {
    server.handle<EchoRequest, EchoResponse>(kEcho(), echo);
    server.handle<EchoRequest, EchoResponse>(kSlow(), echo);
    server.handleLocal(kEcho(), [this](const google::protobuf::Message& m,
                                       google::protobuf::Message& r, LocalPayloads& p) {
      const auto& req = static_cast<const EchoRequest&>(m);
      auto& resp = static_cast<EchoResponse&>(r);
      local_thread = std::this_thread::get_id();
      ++local_calls;
      if (hold) {
        std::unique_lock lock(mu);
        inside = true;
        cv.notify_all();
        cv.wait(lock, [&] { return released; });
      }
      if (req.fail_code()) return Status(static_cast<ErrorCode>(req.fail_code()), "asked to fail");
      if (req.text() == "throw") throw std::runtime_error("asked to throw");
      resp.set_text(req.text());
      resp.set_credential(std::string(p.credential));
      resp.set_request_payload_bytes(static_cast<uint32_t>(p.request.size()));
      resp.set_request_payload_crc(crc32c(p.request));
      if (req.payload_bytes() > p.response.size())
        return Status(ErrorCode::kPayloadTooLarge, "caller's buffer too small");
      for (size_t i = 0; i < req.payload_bytes(); ++i)
        p.response[i] = static_cast<uint8_t>(i % 251);
      p.response_len = req.payload_bytes();
      return Status::OK();
    });
    EXPECT_TRUE(server.start().ok());
  }
  Endpoint endpoint() const { return server.endpoint(); }
};

uint64_t serverCalls(const Method& m) {
  return metrics::Registry::global()
      .counter("rpc_server_calls_total", {{"method", m.name}})
      .value();
}

TEST(LocalCalls, RunOnTheCallingThreadWithTheCallersBuffers) {
  LocalEchoServer s;
  RpcClient rpc(ClientOptions{.local_calls = true});
  std::vector<uint8_t> in(10000, 7), out(5000, 0);
  size_t got = 0;
  EchoRequest req;
  req.set_text("near");
  req.set_payload_bytes(4000);
  EchoResponse resp;
  resp.set_text("stale");  // a response is cleared before the handler fills it
  uint64_t calls = serverCalls(kEcho());
  bool ran_locally = false;
  ASSERT_TRUE(rpc.callSync(s.endpoint(), kEcho(), req, &resp,
                           {.request_payload = in,
                            .response_payload = out,
                            .response_payload_len = &got,
                            .credential = "cst1.a-token",
                            .ran_locally = &ran_locally})
                  .ok());
  EXPECT_TRUE(ran_locally);
  EXPECT_EQ(resp.credential(), "cst1.a-token");  // a local call's handler sees it too
  EXPECT_EQ(s.local_thread.load(), std::this_thread::get_id());
  EXPECT_EQ(s.local_calls.load(), 1);
  EXPECT_EQ(resp.text(), "near");
  EXPECT_EQ(resp.request_payload_bytes(), in.size());
  EXPECT_EQ(resp.request_payload_crc(), crc32c(in));
  ASSERT_EQ(got, 4000u);
  for (size_t i = 0; i < got; ++i) ASSERT_EQ(out[i], i % 251) << i;
  EXPECT_EQ(out[4000], 0);
  EXPECT_EQ(serverCalls(kEcho()), calls + 1);  // counted like a call over the socket
  EXPECT_TRUE(rpc.callsLocally(s.endpoint(), kEcho()));
  EXPECT_FALSE(rpc.callsLocally(s.endpoint(), kSlow()));          // no local handler
  EXPECT_FALSE(RpcClient().callsLocally(s.endpoint(), kEcho()));  // local calls off
  s.server.stop();
  EXPECT_FALSE(rpc.callsLocally(s.endpoint(), kEcho()));
}

TEST(LocalCalls, FailuresAndThrowsComeBackAsTheirStatus) {
  LocalEchoServer s;
  RpcClient rpc(ClientOptions{.local_calls = true});
  EchoRequest req;
  req.set_fail_code(static_cast<uint32_t>(ErrorCode::kNotFound));
  EchoResponse resp;
  size_t got = 99;
  std::vector<uint8_t> out(16);
  Status st = rpc.callSync(s.endpoint(), kEcho(), req, &resp,
                           {.response_payload = out, .response_payload_len = &got});
  EXPECT_EQ(st.code(), ErrorCode::kNotFound) << st.toString();
  EXPECT_EQ(got, 0u);
  req.set_fail_code(0);
  req.set_payload_bytes(17);  // more than the caller's buffer
  EXPECT_EQ(rpc.callSync(s.endpoint(), kEcho(), req, &resp, {.response_payload = out}).code(),
            ErrorCode::kPayloadTooLarge);
  req.set_payload_bytes(0);
  req.set_text("throw");
  st = rpc.callSync(s.endpoint(), kEcho(), req, &resp);
  EXPECT_EQ(st.code(), ErrorCode::kInternal);
  EXPECT_NE(st.message().find("asked to throw"), std::string::npos) << st.toString();
  EXPECT_EQ(s.local_calls.load(), 3);
}

TEST(LocalCalls, WithoutTheOptionOrALocalHandlerCallsGoOverTheSocket) {
  LocalEchoServer s;
  EchoRequest req;
  req.set_text("far");
  EchoResponse resp;
  RpcClient plain;  // local_calls off by default
  bool ran_locally = true;
  ASSERT_TRUE(
      plain.callSync(s.endpoint(), kEcho(), req, &resp, {.ran_locally = &ran_locally}).ok());
  EXPECT_FALSE(ran_locally);
  EXPECT_EQ(resp.text(), "far");
  RpcClient local(ClientOptions{.local_calls = true});
  ASSERT_TRUE(local.callSync(s.endpoint(), kSlow(), req, &resp).ok());  // no local handler
  EXPECT_EQ(resp.text(), "far");
  // The coroutine call of a client never runs locally either.
  asio::io_context io;
  Status async_status;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        async_status = co_await local.call(s.endpoint(), kEcho(), req, &resp);
      },
      asio::detached);
  io.run();
  EXPECT_TRUE(async_status.ok()) << async_status.toString();
  EXPECT_EQ(s.local_calls.load(), 0);
  // Another endpoint of the same host is not this server.
  RpcServer other(ServerOptions{.threads = 1});
  other.handle<EchoRequest, EchoResponse>(kEcho(), echo);
  ASSERT_TRUE(other.start().ok());
  ASSERT_TRUE(local.callSync(other.endpoint(), kEcho(), req, &resp).ok());
  EXPECT_EQ(s.local_calls.load(), 0);
  ASSERT_TRUE(local.callSync(s.endpoint(), kEcho(), req, &resp).ok());
  EXPECT_EQ(s.local_calls.load(), 1);
}

TEST(LocalCalls, StopWaitsForARunningLocalCallAndThenTakesNoMore) {
  LocalEchoServer s;
  s.hold = true;
  Endpoint ep = s.endpoint();
  RpcClient rpc(ClientOptions{.connect_timeout_ms = 1000, .local_calls = true});
  Status first;
  std::thread caller([&] {
    EchoRequest req;
    req.set_text("inside");
    EchoResponse resp;
    first = rpc.callSync(ep, kEcho(), req, &resp, {.timeout_ms = 2000});
  });
  {
    std::unique_lock lock(s.mu);
    ASSERT_TRUE(s.cv.wait_for(lock, std::chrono::seconds(10), [&] { return s.inside; }));
  }
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    s.server.stop();
    stopped = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(stopped.load()) << "stop() returned while a local call was running";
  {
    std::lock_guard lock(s.mu);
    s.released = true;
    s.cv.notify_all();
  }
  stopper.join();
  caller.join();
  EXPECT_TRUE(stopped.load());
  EXPECT_TRUE(first.ok()) << first.toString();
  // Stopped: nothing listens there any more, and the handler is not run.
  EchoRequest req;
  EchoResponse resp;
  Status after = rpc.callSync(ep, kEcho(), req, &resp, {.timeout_ms = 2000});
  EXPECT_FALSE(after.ok());
  EXPECT_EQ(s.local_calls.load(), 1);
}

// A server may be freed as soon as stop() returns, while callers keep
// trying local calls to it: none runs a handler of the freed server (under
// ASan a stop() that did not wait fails here at once). Callers also leave
// their calls touching nothing of the server once their count lets stop()
// go on — that window is too narrow to hit on purpose.
TEST(LocalCalls, AServerMayBeFreedAsSoonAsStopReturns) {
  for (int round = 0; round < 200; ++round) {
    auto server = std::make_unique<LocalEchoServer>();
    Endpoint ep = server->endpoint();
    std::atomic<int> calls{0};
    std::vector<std::thread> callers;
    for (int t = 0; t < 3; ++t) {
      callers.emplace_back([&] {
        EchoRequest req;
        EchoResponse resp;
        // Until the server is gone from the registry.
        while (callLocal(ep, kEcho(), req, &resp, {}, {}, nullptr)) ++calls;
      });
    }
    while (calls.load() < 3) std::this_thread::yield();
    server->server.stop();
    server.reset();
    for (auto& c : callers) c.join();
  }
}

}  // namespace
}  // namespace cistern::net
