// RPC server and client behaviour, including hostile and broken peers.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/crc32c.h"
#include "common/log.h"
#include "common/metrics.h"
#include "net/local_call.h"
#include "net/rpc_client.h"
#include "net/rpc_server.h"
#include "net/rpc_test_util.h"
#include "test_rpc.pb.h"

namespace cistern::net {
namespace {

using namespace test_util;

// Captures warnings so tests can check that bad peers are named in the log.
struct LogCapture {
  static std::mutex mu;
  static std::vector<std::string> lines;
  static void sink(log::Level l, std::string_view c, std::string_view m) {
    std::lock_guard lock(mu);
    lines.push_back(std::string(c) + ": " + std::string(m));
  }
  static bool contains(std::string_view needle) {
    std::lock_guard lock(mu);
    for (auto& l : lines) {
      if (l.find(needle) != std::string::npos) return true;
    }
    return false;
  }
};
std::mutex LogCapture::mu;
std::vector<std::string> LogCapture::lines;

// Run with and without connections of their own for callSync().
class RpcTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    log::setTestSink(&LogCapture::sink);
    startServer();
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
    log::setTestSink(nullptr);
  }

  void startServer(ServerOptions o = {}) {
    o.threads = 2;
    o.listen_port = port_;
    server_ = std::make_unique<RpcServer>(o);
    server_->handle<EchoRequest, EchoResponse>(kEcho(), echo);
    server_->handle<EchoRequest, EchoResponse>(kSlow(), echo);
    ASSERT_TRUE(server_->start().ok());
    port_ = server_->endpoint().port;
  }

  RpcClient& client(ClientOptions o = {}) {
    if (!GetParam()) o.sync_connections_per_endpoint = 0;
    if (!client_) client_ = std::make_unique<RpcClient>(o);
    return *client_;
  }

  Status echoCall(const std::string& text, EchoResponse* resp, CallOptions opts = {}) {
    EchoRequest req;
    req.set_text(text);
    return client().callSync(Endpoint{"127.0.0.1", port_}, kEcho(), req, resp, opts);
  }

  // A raw socket to the server, for sending bytes no client would.
  asio::ip::tcp::socket rawConnect(asio::io_context& io) {
    asio::ip::tcp::socket s(io);
    s.connect({asio::ip::make_address("127.0.0.1"), server_->endpoint().port});
    return s;
  }

  // True when the server closes the raw socket (read returns EOF) within 5 s.
  bool serverCloses(asio::ip::tcp::socket& s) {
    timeval tv{5, 0};
    setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char c;
    ssize_t n = ::recv(s.native_handle(), &c, 1, 0);
    return n == 0;
  }

  std::string validRequestFrame(uint32_t method, const std::string& msg, uint64_t id = 1) {
    FrameHeader h;
    h.request_id = id;
    h.method = method;
    h.message_len = static_cast<uint32_t>(msg.size());
    h.body_crc = crc32c(msg);
    std::string out(kHeaderSize, '\0');
    encodeHeader(h, reinterpret_cast<uint8_t*>(out.data()));
    return out + msg;
  }

  uint16_t port_ = 0;
  std::unique_ptr<RpcServer> server_;
  std::unique_ptr<RpcClient> client_;
};

TEST_P(RpcTest, EchoRoundTripsMessage) {
  EchoResponse resp;
  ASSERT_TRUE(echoCall("hello", &resp).ok());
  EXPECT_EQ(resp.text(), "hello");
  EXPECT_EQ(resp.request_payload_bytes(), 0u);
}

TEST_P(RpcTest, ACredentialTravelsBeforeTheMessage) {
  EchoResponse resp;
  std::string token(700, 'k');
  token[0] = 'c';
  ASSERT_TRUE(echoCall("with a token", &resp, {.credential = token}).ok());
  EXPECT_EQ(resp.text(), "with a token");
  EXPECT_EQ(resp.credential(), token);
  ASSERT_TRUE(echoCall("", &resp, {.credential = "only a credential"}).ok());
  EXPECT_EQ(resp.credential(), "only a credential");
  ASSERT_TRUE(echoCall("none", &resp).ok());
  EXPECT_EQ(resp.credential(), "");
  std::string too_long(kCredentialBytesMax + 1, 'x');
  Status s = echoCall("x", &resp, {.credential = too_long});
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("credential of 1025 bytes exceeds 1024"), std::string::npos)
      << s.toString();
}

TEST_P(RpcTest, PayloadsTravelBothWaysIntoCallerBuffers) {
  std::vector<uint8_t> out(3 << 20), in(4 << 20, 0);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7);
  EchoRequest req;
  req.set_echo_payload(true);
  EchoResponse resp;
  size_t got = 0;
  Status s = client().callSync(
      server_->endpoint(), kEcho(), req, &resp,
      {.request_payload = out, .response_payload = in, .response_payload_len = &got});
  ASSERT_TRUE(s.ok()) << s.toString();
  EXPECT_EQ(resp.request_payload_bytes(), out.size());
  EXPECT_EQ(resp.request_payload_crc(), crc32c(out));
  ASSERT_EQ(got, out.size());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), in.begin()));
}

TEST_P(RpcTest, HandlerErrorsReachTheCallerWithCodeAndMessage) {
  EchoRequest req;
  req.set_fail_code(static_cast<uint32_t>(ErrorCode::kNotFound));
  EchoResponse resp;
  Status s = client().callSync(server_->endpoint(), kEcho(), req, &resp);
  EXPECT_EQ(s.code(), ErrorCode::kNotFound);
  EXPECT_EQ(s.message(), "requested failure");
}

TEST_P(RpcTest, UnknownMethodIsAnsweredAndTheConnectionStaysUsable) {
  EchoRequest req;
  EchoResponse resp;
  Status s = client().callSync(server_->endpoint(), kMissing(), req, &resp);
  EXPECT_EQ(s.code(), ErrorCode::kUnknownMethod);
  EXPECT_TRUE(LogCapture::contains("unknown method 0xff020001 from 127.0.0.1:"));
  EXPECT_TRUE(echoCall("still there", &resp).ok());
  EXPECT_EQ(server_->connectionCount(), 1u);
}

TEST_P(RpcTest, UnparsableMessageIsAnsweredWithBadMessage) {
  asio::io_context io;
  auto s = rawConnect(io);
  asio::write(s, asio::buffer(validRequestFrame(kEcho().id, "\xff\xff\xff")));
  uint8_t hbuf[kHeaderSize];
  asio::read(s, asio::buffer(hbuf));
  auto h = decodeHeader(hbuf, {});
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->status, static_cast<uint16_t>(ErrorCode::kBadMessage));
}

TEST_P(RpcTest, DeadlineExpiresAndLaterCallsStillWork) {
  EchoRequest req;
  req.set_sleep_ms(1000);
  EchoResponse resp;
  auto t0 = std::chrono::steady_clock::now();
  Status s = client().callSync(server_->endpoint(), kSlow(), req, &resp, {.timeout_ms = 100});
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(s.code(), ErrorCode::kDeadlineExceeded);
  EXPECT_LT(took, std::chrono::milliseconds(900));
  EXPECT_TRUE(echoCall("after", &resp).ok());
  EXPECT_EQ(resp.text(), "after");
}

// A peer that accepts and then reads nothing: the request's bytes fill the
// socket buffers and the send blocks; the deadline still ends the call.
TEST_P(RpcTest, DeadlineEndsASendThatThePeerNeverReads) {
  asio::io_context io;
  asio::ip::tcp::acceptor silent(io, {asio::ip::make_address("127.0.0.1"), 0});
  Endpoint ep{"127.0.0.1", silent.local_endpoint().port()};
  std::vector<uint8_t> payload(60u << 20, 0x5a);  // far more than loopback buffers hold
  EchoRequest req;
  EchoResponse resp;
  auto t0 = std::chrono::steady_clock::now();
  Status s =
      client().callSync(ep, kEcho(), req, &resp, {.timeout_ms = 300, .request_payload = payload});
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(s.code(), ErrorCode::kDeadlineExceeded) << s.toString();
  EXPECT_GE(took, std::chrono::milliseconds(290));
  EXPECT_LT(took, std::chrono::milliseconds(2000));
  // The server the fixture runs is still reachable through the same client.
  EXPECT_TRUE(echoCall("after", &resp).ok());
}

TEST_P(RpcTest, CancelFromAnotherThreadEndsTheCall) {
  auto token = std::make_shared<CancelToken>();
  std::thread canceller([token] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    token->cancel();
  });
  EchoRequest req;
  req.set_sleep_ms(2000);
  EchoResponse resp;
  auto t0 = std::chrono::steady_clock::now();
  Status s = client().callSync(server_->endpoint(), kSlow(), req, &resp, {.cancel = token});
  canceller.join();
  EXPECT_EQ(s.code(), ErrorCode::kCancelled);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500));
  // A call with an already cancelled token fails at once.
  EXPECT_EQ(client().callSync(server_->endpoint(), kEcho(), req, &resp, {.cancel = token}).code(),
            ErrorCode::kCancelled);
}

TEST_P(RpcTest, ThousandConcurrentCallsOnOneConnection) {
  ClientOptions o;
  o.connections_per_endpoint = 1;
  o.inflight_per_connection_max = 64;
  RpcClient& c = client(o);
  asio::io_context io;
  std::atomic<int> ok{0}, wrong{0};
  Endpoint ep = server_->endpoint();
  for (int i = 0; i < 1000; ++i) {
    asio::co_spawn(
        io,
        [&, i]() -> asio::awaitable<void> {
          EchoRequest req;
          req.set_text("call-" + std::to_string(i));
          req.set_sleep_ms(i % 3);
          EchoResponse resp;
          Status s = co_await c.call(ep, kEcho(), req, &resp);
          if (s.ok() && resp.text() == req.text())
            ok++;
          else
            wrong++;
        },
        asio::detached);
  }
  io.run();
  EXPECT_EQ(ok.load(), 1000);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(server_->connectionCount(), 1u);
}

TEST_P(RpcTest, GarbageFromAPeerClosesOnlyThatConnection) {
  EchoResponse resp;
  ASSERT_TRUE(echoCall("warm", &resp).ok());
  asio::io_context io;
  auto s = rawConnect(io);
  std::string garbage(200, 'G');
  asio::write(s, asio::buffer(garbage));
  EXPECT_TRUE(serverCloses(s));
  EXPECT_TRUE(LogCapture::contains("bad magic"));
  EXPECT_TRUE(LogCapture::contains("closing connection from 127.0.0.1:"));
  ASSERT_TRUE(echoCall("unaffected", &resp).ok());
  EXPECT_EQ(resp.text(), "unaffected");
}

TEST_P(RpcTest, OversizedLengthIsRejectedBeforeAllocating) {
  asio::io_context io;
  auto s = rawConnect(io);
  FrameHeader h;
  h.method = kEcho().id;
  h.message_len = 0x7fffffff;  // 2 GiB: must be refused, not allocated
  uint8_t buf[kHeaderSize];
  encodeHeader(h, buf);
  asio::write(s, asio::buffer(buf));
  EXPECT_TRUE(serverCloses(s));
  EXPECT_TRUE(LogCapture::contains("message of 2147483647 bytes exceeds"));
  EchoResponse resp;
  EXPECT_TRUE(echoCall("fine", &resp).ok());
}

TEST_P(RpcTest, BodyChecksumMismatchClosesTheConnection) {
  asio::io_context io;
  auto s = rawConnect(io);
  std::string frame = validRequestFrame(kEcho().id, "\x0a\x02hi");
  frame.back() ^= 1;
  asio::write(s, asio::buffer(frame));
  EXPECT_TRUE(serverCloses(s));
  EXPECT_TRUE(LogCapture::contains("body checksum mismatch"));
}

TEST_P(RpcTest, PeerDisconnectingMidFrameIsLoggedAndSurvived) {
  {
    asio::io_context io;
    auto s = rawConnect(io);
    std::string frame = validRequestFrame(kEcho().id, "\x0a\x02hi");
    asio::write(s, asio::buffer(frame.data(), 20));  // half a header
  }
  {
    asio::io_context io;
    auto s = rawConnect(io);
    std::string frame = validRequestFrame(kEcho().id, "\x0a\x05hello");
    asio::write(s, asio::buffer(frame.data(), kHeaderSize + 2));  // header and part of the body
  }
  for (int i = 0; i < 50 && !(LogCapture::contains("mid-frame after 20 header bytes") &&
                              LogCapture::contains("mid-frame in the body"));
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(LogCapture::contains("mid-frame after 20 header bytes"));
  EXPECT_TRUE(LogCapture::contains("mid-frame in the body"));
  EchoResponse resp;
  EXPECT_TRUE(echoCall("alive", &resp).ok());
}

// The server reads ahead into a buffer: frames that arrive together, frames
// cut anywhere, and messages and payloads larger than the buffer must all be
// answered, each with its own bytes.
TEST_P(RpcTest, PipelinedAndSplitFramesAreEachAnswered) {
  asio::io_context io;
  auto s = rawConnect(io);
  constexpr int kFrames = 24;
  std::string wire;
  std::vector<std::string> texts;
  std::vector<std::string> payloads;
  for (int i = 0; i < kFrames; ++i) {
    // Small frames, and every few a message or payload past 16 KiB.
    std::string text(i % 5 == 4 ? 20000 + i : 3 + i, static_cast<char>('a' + i));
    std::string payload(i % 3 == 2 ? 17000 + i * 7 : i * 11, '\0');
    for (size_t k = 0; k < payload.size(); ++k) payload[k] = static_cast<char>(k * 31 + i);
    EchoRequest req;
    req.set_text(text);
    std::string msg = req.SerializeAsString();
    FrameHeader h;
    h.request_id = 100 + static_cast<uint64_t>(i);
    h.method = kEcho().id;
    h.message_len = static_cast<uint32_t>(msg.size());
    h.payload_len = static_cast<uint32_t>(payload.size());
    h.flags = kFlagPayloadCrc;
    h.body_crc = crc32cExtend(crc32c(msg), payload.data(), payload.size());
    std::string head(kHeaderSize, '\0');
    encodeHeader(h, reinterpret_cast<uint8_t*>(head.data()));
    wire += head + msg + payload;
    texts.push_back(text);
    payloads.push_back(payload);
  }
  // The first half in one write, the rest in pieces of 1 to 97 bytes.
  size_t half = wire.size() / 2;
  asio::write(s, asio::buffer(wire.data(), half));
  for (size_t at = half, step = 1; at < wire.size(); at += step, step = step % 97 + 13) {
    asio::write(s, asio::buffer(wire.data() + at, std::min(step, wire.size() - at)));
  }
  timeval tv{10, 0};
  setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::vector<bool> seen(kFrames, false);
  for (int n = 0; n < kFrames; ++n) {
    uint8_t hbuf[kHeaderSize];
    asio::read(s, asio::buffer(hbuf));
    auto h = decodeHeader(hbuf, FrameLimits{});
    ASSERT_TRUE(h.ok()) << h.status().toString();
    ASSERT_TRUE(h->isResponse());
    ASSERT_EQ(h->status, 0);
    std::string body(h->message_len + h->payload_len, '\0');
    asio::read(s, asio::buffer(body));
    EchoResponse resp;
    ASSERT_TRUE(resp.ParseFromArray(body.data(), static_cast<int>(h->message_len)));
    int i = static_cast<int>(h->request_id) - 100;
    ASSERT_TRUE(i >= 0 && i < kFrames) << h->request_id;
    EXPECT_FALSE(seen[i]) << "answered twice: " << i;
    seen[i] = true;
    EXPECT_EQ(resp.text(), texts[i]) << i;
    EXPECT_EQ(resp.request_payload_bytes(), payloads[i].size()) << i;
    EXPECT_EQ(resp.request_payload_crc(), crc32c(payloads[i])) << i;
  }
  // And the connection is still in step for a normal call.
  EchoResponse resp;
  ASSERT_TRUE(echoCall("after", &resp).ok());
  EXPECT_EQ(resp.text(), "after");
}

TEST_P(RpcTest, SlowReaderIsThrottledNotBuffered) {
  server_.reset();
  ServerOptions o;
  o.inflight_per_connection_max = 4;
  startServer(o);
  auto& queued = metrics::Registry::global().gauge("rpc_server_queued_response_bytes");
  asio::io_context io;
  auto s = rawConnect(io);
  // Ask for 200 responses of 1 MiB each and never read them.
  EchoRequest req;
  req.set_payload_bytes(1 << 20);
  std::string msg = req.SerializeAsString();
  int sent = 0;
  s.non_blocking(true);
  for (int i = 0; i < 200; ++i) {
    std::string frame = validRequestFrame(kEcho().id, msg, static_cast<uint64_t>(i + 1));
    asio::error_code ec;
    size_t n = s.write_some(asio::buffer(frame), ec);
    if (ec || n != frame.size()) break;  // the server stopped reading: backpressure reached us
    ++sent;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // At most `inflight_per_connection_max` responses are held, whatever was sent.
  EXPECT_LE(queued.value(), 4 * ((1 << 20) + 200));
  // Other clients are served meanwhile.
  EchoResponse resp;
  EXPECT_TRUE(echoCall("other client", &resp).ok());
  EXPECT_GT(sent, 4);
}

TEST_P(RpcTest, ResponsePayloadLargerThanTheBufferFailsCleanly) {
  EchoRequest req;
  req.set_payload_bytes(10000);
  EchoResponse resp;
  std::vector<uint8_t> small(100);
  Status s =
      client().callSync(server_->endpoint(), kEcho(), req, &resp, {.response_payload = small});
  EXPECT_EQ(s.code(), ErrorCode::kPayloadTooLarge);
  EXPECT_TRUE(echoCall("next", &resp).ok());
}

TEST_P(RpcTest, UnreachableServerFailsFastNamingTheEndpoint) {
  Endpoint ep = server_->endpoint();
  server_.reset();
  EchoRequest req;
  EchoResponse resp;
  Status s = client().callSync(ep, kEcho(), req, &resp, {.timeout_ms = 2000});
  EXPECT_EQ(s.code(), ErrorCode::kConnectionFailed);
  EXPECT_NE(s.message().find(ep.toString()), std::string::npos) << s.toString();
}

TEST_P(RpcTest, ClientReconnectsAfterServerRestart) {
  EchoResponse resp;
  ASSERT_TRUE(echoCall("before", &resp).ok());
  server_.reset();
  Status during = echoCall("during", &resp, {.timeout_ms = 500});
  EXPECT_FALSE(during.ok());
  startServer();  // same port
  Status after = echoCall("after", &resp);
  ASSERT_TRUE(after.ok()) << after.toString();
  EXPECT_EQ(resp.text(), "after");
}

// A connection that sat idle while the server restarted is found closed
// before it is used again: the first call after the restart succeeds.
TEST_P(RpcTest, AnIdleConnectionToARestartedServerIsReplacedBeforeUse) {
  EchoResponse resp;
  ASSERT_TRUE(echoCall("before", &resp).ok());
  server_.reset();
  startServer();                                                // same port
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // idle past the trusted window
  Status after = echoCall("after", &resp);
  ASSERT_TRUE(after.ok()) << after.toString();
  EXPECT_EQ(resp.text(), "after");
}

TEST_P(RpcTest, StopLetsInFlightCallsFinish) {
  EchoRequest req;
  req.set_sleep_ms(300);
  req.set_text("finishing");
  EchoResponse resp;
  Status result;
  std::thread caller([&] { result = client().callSync(server_->endpoint(), kSlow(), req, &resp); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server_->stop();
  caller.join();
  EXPECT_TRUE(result.ok()) << result.toString();
  EXPECT_EQ(resp.text(), "finishing");
  EXPECT_EQ(server_->connectionCount(), 0u);
}

TEST_P(RpcTest, ServerMetricsCountCalls) {
  auto& calls = metrics::Registry::global().counter("rpc_server_calls_total",
                                                    {{"method", "cistern.test.EchoService.Echo"}});
  uint64_t before = calls.value();
  EchoResponse resp;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(echoCall("x", &resp).ok());
  EXPECT_EQ(calls.value(), before + 5);
  std::string text = metrics::Registry::global().renderPrometheus();
  EXPECT_NE(text.find("rpc_server_latency_us_count{method=\"cistern.test.EchoService.Echo\"}"),
            std::string::npos);
}

TEST_P(RpcTest, ManyBlockingCallersShareABoundedSetOfConnections) {
  ClientOptions o;
  o.connections_per_endpoint = 1;
  o.sync_connections_per_endpoint = 3;
  RpcClient& c = client(o);
  constexpr int kThreads = 12;
  std::atomic<int> ok{0};
  std::atomic<size_t> most_connections{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        EchoRequest req;
        req.set_text(fmt::format("{}-{}", t, i));
        req.set_sleep_ms(20);
        EchoResponse resp;
        Status s = c.callSync(server_->endpoint(), kSlow(), req, &resp);
        if (s.ok() && resp.text() == req.text()) ++ok;
        size_t n = server_->connectionCount();
        size_t m = most_connections.load();
        while (n > m && !most_connections.compare_exchange_weak(m, n)) {
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), kThreads * 5);
  // Three of their own (when enabled) plus the one shared connection.
  EXPECT_LE(most_connections.load(), GetParam() ? 4u : 1u);
  if (GetParam()) {
    EXPECT_GE(most_connections.load(), 2u);
  }
}

// A server that answers every request with the bytes `reply` returns, then
// closes the connection when `reply` says so (empty reply: close at once).
class FakeServer {
 public:
  explicit FakeServer(std::function<std::string(const FrameHeader&)> reply)
      : reply_(std::move(reply)), acceptor_(io_, {asio::ip::make_address("127.0.0.1"), 0}) {
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeServer() {
    stop_ = true;
    asio::error_code ec;
    asio::ip::tcp::socket wake(io_);
    wake.connect({asio::ip::make_address("127.0.0.1"), endpoint().port}, ec);
    thread_.join();
  }
  Endpoint endpoint() const { return {"127.0.0.1", acceptor_.local_endpoint().port()}; }

 private:
  void serve() {
    for (;;) {
      asio::error_code ec;
      asio::ip::tcp::socket s(io_);
      acceptor_.accept(s, ec);
      if (ec || stop_) return;
      uint8_t hbuf[kHeaderSize];
      asio::read(s, asio::buffer(hbuf), ec);
      if (ec) continue;
      auto h = decodeHeader(hbuf, {});
      if (!h.ok()) continue;
      std::string body(h->message_len + h->payload_len, '\0');
      asio::read(s, asio::buffer(body), ec);
      std::string out = reply_(*h);
      if (!out.empty()) asio::write(s, asio::buffer(out), ec);
      s.close(ec);
    }
  }
  std::function<std::string(const FrameHeader&)> reply_;
  std::atomic<bool> stop_{false};
  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_;
  std::thread thread_;
};

std::string responseFrame(const FrameHeader& req, const std::string& msg, uint64_t id_delta = 0,
                          uint32_t crc_delta = 0) {
  FrameHeader h;
  h.flags = kFlagResponse;
  h.request_id = req.request_id + id_delta;
  h.method = req.method;
  h.message_len = static_cast<uint32_t>(msg.size());
  h.body_crc = crc32c(msg) + crc_delta;
  std::string out(kHeaderSize, '\0');
  encodeHeader(h, reinterpret_cast<uint8_t*>(out.data()));
  return out + msg;
}

TEST_P(RpcTest, BrokenAnswersFromAServerAreClearErrors) {
  EchoResponse good;
  good.set_text("fine");
  struct Case {
    const char* what;
    std::function<std::string(const FrameHeader&)> reply;
    ErrorCode want;
  } cases[] = {
      {"closes without answering", [](const FrameHeader&) { return std::string(); },
       ErrorCode::kConnectionClosed},
      {"garbage header", [](const FrameHeader&) { return std::string(kHeaderSize, 'x'); },
       ErrorCode::kBadFrame},
      {"bad body checksum",
       [&](const FrameHeader& h) { return responseFrame(h, good.SerializeAsString(), 0, 1); },
       ErrorCode::kBadFrame},
      {"unparsable message", [](const FrameHeader& h) { return responseFrame(h, "\xff\xff\xff"); },
       ErrorCode::kBadMessage},
      {"half a message",
       [&](const FrameHeader& h) {
         std::string f = responseFrame(h, good.SerializeAsString());
         return f.substr(0, f.size() - 2);
       },
       ErrorCode::kConnectionClosed},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    FakeServer fake(c.reply);
    RpcClient rpc(ClientOptions{.sync_connections_per_endpoint = GetParam() ? 2u : 0u});
    EchoRequest req;
    req.set_text("hello");
    EchoResponse resp;
    Status s = rpc.callSync(fake.endpoint(), kEcho(), req, &resp, {.timeout_ms = 5000});
    EXPECT_EQ(s.code(), c.want) << s.toString();
  }
  // And a well-formed answer gets through the same fake.
  FakeServer fake([&](const FrameHeader& h) { return responseFrame(h, good.SerializeAsString()); });
  RpcClient rpc(ClientOptions{.sync_connections_per_endpoint = GetParam() ? 2u : 0u});
  EchoRequest req;
  EchoResponse resp;
  ASSERT_TRUE(rpc.callSync(fake.endpoint(), kEcho(), req, &resp).ok());
  EXPECT_EQ(resp.text(), "fine");
}

INSTANTIATE_TEST_SUITE_P(Calls, RpcTest, ::testing::Bool(), [](const auto& info) {
  return info.param ? "own_connections" : "shared";
});

TEST(RpcServerStart, BindFailureNamesTheAddress) {
  RpcServer a(ServerOptions{.threads = 1});
  ASSERT_TRUE(a.start().ok());
  RpcServer b(ServerOptions{.listen_port = a.endpoint().port, .threads = 1});
  Status s = b.start();
  EXPECT_EQ(s.code(), ErrorCode::kIOError);
  EXPECT_NE(s.message().find(std::to_string(a.endpoint().port)), std::string::npos) << s.toString();
  RpcServer c(ServerOptions{.listen_host = "not-an-address", .threads = 1});
  EXPECT_EQ(c.start().code(), ErrorCode::kInvalidArgument);
  RpcServer d(ServerOptions{.listen_port = 70000, .threads = 1});
  EXPECT_EQ(d.start().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace cistern::net
