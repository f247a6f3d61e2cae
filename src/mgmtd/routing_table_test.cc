// The routing table in the KV, on every KV engine: what publish() writes is
// what loadRouting() reads, and the version moves exactly when something changed.
#include "mgmtd/routing_table.h"

#include <gtest/gtest.h>

#include "kv/cluster_keys.h"
#include "kv/kv_test_util.h"

namespace cistern::mgmtd {
namespace {

class RoutingTableTest : public ::testing::TestWithParam<kv::EngineFactory> {
 protected:
  void SetUp() override { engine_ = GetParam().open(dir_.path(), {}); }

  static LocalLayout twoTargets() {
    LocalLayout l;
    l.meta_endpoint = "127.0.0.1:7420";
    l.targets = {{1, "127.0.0.1:7421", "/data/target-1"}, {2, "127.0.0.1:7422", "/data/target-2"}};
    return l;
  }

  kv::TempDir dir_;
  std::unique_ptr<kv::Engine> engine_;
};

TEST_P(RoutingTableTest, NothingBeforeTheFirstPublish) {
  EXPECT_EQ(loadRouting(*engine_).code(), ErrorCode::kNotFound);
}

TEST_P(RoutingTableTest, PublishedTargetsAndChainsReadBack) {
  auto v = publish(*engine_, twoTargets());
  ASSERT_TRUE(v.ok()) << v.status().toString();
  EXPECT_EQ(*v, 1u);
  auto r = loadRouting(*engine_);
  ASSERT_TRUE(r.ok()) << r.status().toString();
  EXPECT_EQ(r->version(), 1u);
  EXPECT_EQ(r->meta_endpoint(), "127.0.0.1:7420");
  ASSERT_EQ(r->targets_size(), 2);
  EXPECT_EQ(r->targets(1).id(), 2u);
  EXPECT_EQ(r->targets(1).endpoint(), "127.0.0.1:7422");
  EXPECT_EQ(r->targets(1).path(), "/data/target-2");
  EXPECT_EQ(r->targets(1).chain(), 2u);
  ASSERT_EQ(r->chains_size(), 2);
  EXPECT_EQ(r->chains(0).id(), 1u);
  ASSERT_EQ(r->chains(0).targets_size(), 1);
  EXPECT_EQ(r->chains(0).targets(0), 1u);
}

TEST_P(RoutingTableTest, TheVersionMovesOnlyWhenSomethingChanged) {
  ASSERT_EQ(*publish(*engine_, twoTargets()), 1u);
  EXPECT_EQ(*publish(*engine_, twoTargets()), 1u);  // a restart with the same layout
  LocalLayout moved = twoTargets();
  moved.targets[0].endpoint = "127.0.0.1:9999";  // a target on another port
  EXPECT_EQ(*publish(*engine_, moved), 2u);
  EXPECT_EQ(loadRouting(*engine_)->targets(0).endpoint(), "127.0.0.1:9999");
  LocalLayout more = moved;
  more.targets.push_back({3, "127.0.0.1:7423", "/data/target-3"});
  EXPECT_EQ(*publish(*engine_, more), 3u);
  // A start with fewer targets keeps the others' rows: their data is still there.
  EXPECT_EQ(*publish(*engine_, moved), 3u);
  EXPECT_EQ(loadRouting(*engine_)->targets_size(), 3);
  LocalLayout meta_moved = more;
  meta_moved.meta_endpoint = "127.0.0.1:1";
  EXPECT_EQ(*publish(*engine_, meta_moved), 4u);
}

TEST_P(RoutingTableTest, ChainRowsOfOlderVersionsReadAsOneTargetChains) {
  ASSERT_TRUE(kv::runTransaction(*engine_, [](kv::Transaction& t) {
                t.set(kv::chainKey(7), "");  // how `cistern up` kept the chain table before
                return Status::OK();
              }).ok());
  ASSERT_TRUE(publish(*engine_, twoTargets()).ok());
  auto r = loadRouting(*engine_);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->chains_size(), 3);
  EXPECT_EQ(r->chains(2).id(), 7u);
  EXPECT_EQ(r->chains(2).version(), 1u);
  ASSERT_EQ(r->chains(2).targets_size(), 1);
  EXPECT_EQ(r->chains(2).targets(0), 7u);
}

TEST_P(RoutingTableTest, BadLayoutsAndDamagedRowsAreErrors) {
  LocalLayout bad = twoTargets();
  bad.targets[0].id = 0;
  EXPECT_EQ(publish(*engine_, bad).code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(publish(*engine_, twoTargets()).ok());
  ASSERT_TRUE(kv::runTransaction(*engine_, [](kv::Transaction& t) {
                t.set(kv::targetKey(2), std::string("\xff\xff\xff", 3));
                return Status::OK();
              }).ok());
  EXPECT_EQ(loadRouting(*engine_).code(), ErrorCode::kCorruption);
}

INSTANTIATE_TEST_SUITE_P(AllEngines, RoutingTableTest, ::testing::ValuesIn(kv::allEngines()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace cistern::mgmtd
