// Test support: a service test fixture whose cases run both ways — over the
// socket, and as local calls on the caller's thread (net/local_call.h) — by
// replacing the fixture's `client_` with one that has local calls on or off.
//
//   using FooCallers = testing::BothCallers<FooServiceTest>;
//   INSTANTIATE_TEST_SUITE_P(From, FooCallers, ::testing::Bool(), testing::callerName);
//   TEST_P(FooCallers, Something) { ... }
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "net/rpc_client.h"

namespace cistern::testing {

template <typename Fixture>
class BothCallers : public Fixture, public ::testing::WithParamInterface<bool> {
 protected:
  bool local() const { return this->GetParam(); }
  void SetUp() override {
    Fixture::SetUp();
    this->client_ = std::make_unique<net::RpcClient>(net::ClientOptions{.local_calls = local()});
  }
};

inline std::string callerName(const ::testing::TestParamInfo<bool>& info) {
  return info.param ? "local" : "socket";
}

}  // namespace cistern::testing
