// Shared by the RPC tests: the test Echo service's methods and its handler.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include "common/crc32c.h"
#include "net/rpc_server.h"
#include "test_rpc.pb.h"

namespace cistern::net::test_util {

using test::EchoRequest;
using test::EchoResponse;

inline const Method& kEcho() {
  static const Method m = Method::of("cistern.test.EchoService.Echo");
  return m;
}
inline const Method& kSlow() {
  static const Method m = Method::of("cistern.test.EchoService.Slow");
  return m;
}
inline const Method& kMissing() {
  static const Method m = Method::of("cistern.test.MissingService.Nothing");
  return m;
}

inline asio::awaitable<Status> echo(CallContext& ctx, const EchoRequest& req, EchoResponse& resp) {
  if (req.sleep_ms()) {
    asio::steady_timer t(co_await asio::this_coro::executor);
    t.expires_after(std::chrono::milliseconds(req.sleep_ms()));
    co_await t.async_wait(asio::use_awaitable);
  }
  if (req.fail_code())
    co_return Status(static_cast<ErrorCode>(req.fail_code()), "requested failure");
  resp.set_text(req.text());
  resp.set_credential(ctx.credential());
  auto in = ctx.requestPayload();
  resp.set_request_payload_bytes(static_cast<uint32_t>(in.size()));
  resp.set_request_payload_crc(crc32c(in));
  if (req.echo_payload()) {
    auto copy = std::make_shared<std::vector<uint8_t>>(in.begin(), in.end());
    ctx.setResponsePayload(*copy, copy);
  } else if (req.payload_bytes()) {
    auto out = std::make_shared<std::vector<uint8_t>>(req.payload_bytes());
    for (size_t i = 0; i < out->size(); ++i) (*out)[i] = static_cast<uint8_t>(i % 251);
    ctx.setResponsePayload(*out, out);
  }
  co_return Status::OK();
}

}  // namespace cistern::net::test_util
