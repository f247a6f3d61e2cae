// Metrics: counters, gauges and histograms, rendered in the Prometheus text
// exposition format (served at /metrics by every process).
//
// A metric is identified by a name and a label set; the registry creates it
// on first use and returns a reference that stays valid for the registry's
// lifetime, so hot paths look a metric up once and keep the reference.
// Updates are lock-free atomics and safe from any thread; creation takes a
// mutex. Memory is bounded by the number of distinct (name, labels) pairs,
// which code chooses, never by input.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace cistern::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void inc(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

class Gauge {
 public:
  void set(int64_t v) { v_.store(v, std::memory_order_relaxed); }
  void add(int64_t d) { v_.fetch_add(d, std::memory_order_relaxed); }
  int64_t value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> v_{0};
};

// Histogram over non-negative integer observations (microseconds, bytes).
// Buckets are log-linear: each power of two is split in 4, so a quantile is
// exact to within 25% over the whole uint64 range with a fixed 256 buckets.
class Histogram {
 public:
  static constexpr int kSubBuckets = 4;
  static constexpr int kBuckets = 64 * kSubBuckets;

  void observe(uint64_t v);
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  uint64_t sum() const { return sum_.load(std::memory_order_relaxed); }
  // q in [0, 1]; returns the upper bound of the bucket holding the q-quantile,
  // or 0 when empty.
  uint64_t quantile(double q) const;

  static int bucketOf(uint64_t v);
  static uint64_t bucketUpperBound(int bucket);  // inclusive

 private:
  friend class Registry;
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_{0};
};

class Registry {
 public:
  // The process-wide registry that /metrics serves.
  static Registry& global();

  // `help` is recorded the first time the name is seen. Names follow
  // Prometheus rules ([a-zA-Z_:][a-zA-Z0-9_:]*); a bad name aborts (a bug).
  Counter& counter(const std::string& name, const Labels& labels = {},
                   const std::string& help = "");
  Gauge& gauge(const std::string& name, const Labels& labels = {}, const std::string& help = "");
  Histogram& histogram(const std::string& name, const Labels& labels = {},
                       const std::string& help = "");

  // Prometheus text format, families sorted by name. Histograms are rendered
  // as `histogram` (cumulative buckets at the non-empty bucket bounds, +Inf,
  // _sum, _count) plus a gauge family `<name>_quantile{quantile="0.5"|"0.99"}`.
  std::string renderPrometheus() const;

 private:
  enum class Kind { kCounter, kGauge, kHistogram };
  struct Family {
    Kind kind;
    std::string help;
    std::map<std::string, std::unique_ptr<Counter>> counters;  // key: rendered labels
    std::map<std::string, std::unique_ptr<Gauge>> gauges;
    std::map<std::string, std::unique_ptr<Histogram>> histograms;
  };
  Family& family(const std::string& name, Kind kind, const std::string& help);

  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
};

// Renders labels as `{a="x",b="y"}` with Prometheus escaping; "" for none.
std::string renderLabels(const Labels& labels);

// The median of `v` (the mean of the middle two for an even count; 0 for
// none): benchmarks report the medians of their alternating rounds.
double median(std::vector<double> v);

}  // namespace cistern::metrics
