#include "common/metrics.h"

#include <gtest/gtest.h>

#include <thread>

namespace cistern::metrics {
namespace {

TEST(Histogram, BucketsAreMonotoneAndCoverValues) {
  for (uint64_t v :
       {0ull, 1ull, 3ull, 4ull, 5ull, 7ull, 8ull, 9ull, 1000ull, 123456789ull, ~0ull}) {
    int b = Histogram::bucketOf(v);
    ASSERT_LT(b, Histogram::kBuckets);
    EXPECT_LE(v, Histogram::bucketUpperBound(b)) << v;
    if (b > 0) {
      EXPECT_GT(v, Histogram::bucketUpperBound(b - 1)) << v;
    }
  }
}

TEST(Histogram, QuantilesWithin25Percent) {
  Histogram h;
  for (uint64_t i = 1; i <= 10000; ++i) h.observe(i);
  EXPECT_EQ(h.count(), 10000u);
  EXPECT_EQ(h.sum(), 10000u * 10001 / 2);
  uint64_t p50 = h.quantile(0.5), p99 = h.quantile(0.99);
  EXPECT_GE(p50, 5000u);
  EXPECT_LE(p50, 6250u);
  EXPECT_GE(p99, 9900u);
  EXPECT_LE(p99, 12375u);
  EXPECT_EQ(Histogram().quantile(0.5), 0u);
}

TEST(Registry, SameNameAndLabelsIsSameMetric) {
  Registry r;
  Counter& a = r.counter("rpc_calls_total", {{"method", "Ping"}});
  Counter& b = r.counter("rpc_calls_total", {{"method", "Ping"}});
  Counter& c = r.counter("rpc_calls_total", {{"method", "Echo"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &c);
}

TEST(Registry, CountersAreExactUnderConcurrency) {
  Registry r;
  Counter& c = r.counter("x_total");
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 100000; ++i) c.inc();
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(c.value(), 400000u);
}

TEST(Registry, RendersPrometheusText) {
  Registry r;
  r.counter("req_total", {{"method", "a\"b"}}, "Requests").inc(3);
  r.gauge("queue_depth").set(-2);
  Histogram& h = r.histogram("lat_us", {{"m", "x"}});
  h.observe(10);
  h.observe(100);
  std::string text = r.renderPrometheus();
  EXPECT_NE(text.find("# HELP req_total Requests\n# TYPE req_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("req_total{method=\"a\\\"b\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("queue_depth -2\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE lat_us histogram"), std::string::npos);
  EXPECT_NE(text.find("lat_us_bucket{m=\"x\",le=\"+Inf\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("lat_us_sum{m=\"x\"} 110\n"), std::string::npos);
  EXPECT_NE(text.find("lat_us_count{m=\"x\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("lat_us_quantile{m=\"x\",quantile=\"0.99\"} "), std::string::npos);
}

TEST(RegistryDeathTest, BadNameOrKindMismatchAborts) {
  Registry r;
  EXPECT_DEATH(r.counter("bad name"), "bad metric name");
  r.counter("dup");
  EXPECT_DEATH(r.gauge("dup"), "two kinds");
}

TEST(Median, OfOddAndEvenCountsAndOfNone) {
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(median({7}), 7);
  EXPECT_EQ(median({}), 0);
}

}  // namespace
}  // namespace cistern::metrics
