#include "common/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

#include "common/assert.h"

namespace cistern::metrics {
namespace {

bool validName(const std::string& n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

std::string escapeLabelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string escapeHelp(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

// Inserts one more label into an already rendered label set.
std::string withLabel(const std::string& rendered, const std::string& k, const std::string& v) {
  std::string extra = fmt::format("{}=\"{}\"", k, v);
  if (rendered.empty()) return "{" + extra + "}";
  return rendered.substr(0, rendered.size() - 1) + "," + extra + "}";
}

}  // namespace

std::string renderLabels(const Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    CISTERN_CHECK(validName(labels[i].first), "bad metric label name");
    if (i) out += ",";
    out += labels[i].first + "=\"" + escapeLabelValue(labels[i].second) + "\"";
  }
  return out + "}";
}

int Histogram::bucketOf(uint64_t v) {
  if (v < kSubBuckets) return static_cast<int>(v);
  int msb = 63 - std::countl_zero(v);  // >= 2
  int sub = static_cast<int>((v >> (msb - 2)) & (kSubBuckets - 1));
  return (msb - 1) * kSubBuckets + sub;
}

uint64_t Histogram::bucketUpperBound(int b) {
  if (b < kSubBuckets) return static_cast<uint64_t>(b);
  int msb = b / kSubBuckets + 1;
  uint64_t sub = static_cast<uint64_t>(b % kSubBuckets);
  uint64_t lower = (uint64_t{1} << msb) | (sub << (msb - 2));
  uint64_t width = uint64_t{1} << (msb - 2);
  return lower + (width - 1);
}

void Histogram::observe(uint64_t v) {
  buckets_[static_cast<size_t>(bucketOf(v))].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

uint64_t Histogram::quantile(double q) const {
  uint64_t total = 0;
  std::array<uint64_t, kBuckets> snap;
  for (int i = 0; i < kBuckets; ++i) {
    snap[i] = buckets_[i].load(std::memory_order_relaxed);
    total += snap[i];
  }
  if (total == 0) return 0;
  if (q < 0) q = 0;
  if (q > 1) q = 1;
  // Rank of the q-quantile, 1-based: the smallest value with at least q of the mass at or below.
  uint64_t rank = static_cast<uint64_t>(q * static_cast<double>(total));
  if (rank == 0) rank = 1;
  uint64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += snap[i];
    if (seen >= rank) return bucketUpperBound(i);
  }
  return bucketUpperBound(kBuckets - 1);
}

Registry& Registry::global() {
  static Registry* r = new Registry();  // never destroyed: metrics outlive static teardown
  return *r;
}

Registry::Family& Registry::family(const std::string& name, Kind kind, const std::string& help) {
  CISTERN_CHECK(validName(name), "bad metric name");
  auto [it, inserted] = families_.try_emplace(name);
  if (inserted) {
    it->second.kind = kind;
    it->second.help = help;
  }
  CISTERN_CHECK(it->second.kind == kind, "metric registered with two kinds");
  return it->second;
}

Counter& Registry::counter(const std::string& name, const Labels& labels, const std::string& help) {
  std::lock_guard lock(mu_);
  auto& slot = family(name, Kind::kCounter, help).counters[renderLabels(labels)];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& Registry::gauge(const std::string& name, const Labels& labels, const std::string& help) {
  std::lock_guard lock(mu_);
  auto& slot = family(name, Kind::kGauge, help).gauges[renderLabels(labels)];
  if (!slot) slot = std::make_unique<Gauge>();
  return *slot;
}

Histogram& Registry::histogram(const std::string& name, const Labels& labels,
                               const std::string& help) {
  std::lock_guard lock(mu_);
  auto& slot = family(name, Kind::kHistogram, help).histograms[renderLabels(labels)];
  if (!slot) slot = std::make_unique<Histogram>();
  return *slot;
}

std::string Registry::renderPrometheus() const {
  std::lock_guard lock(mu_);
  std::string out;
  auto header = [&](const std::string& name, const Family& f, const char* type) {
    if (!f.help.empty()) out += fmt::format("# HELP {} {}\n", name, escapeHelp(f.help));
    out += fmt::format("# TYPE {} {}\n", name, type);
  };
  for (const auto& [name, f] : families_) {
    switch (f.kind) {
      case Kind::kCounter:
        header(name, f, "counter");
        for (const auto& [labels, c] : f.counters)
          out += fmt::format("{}{} {}\n", name, labels, c->value());
        break;
      case Kind::kGauge:
        header(name, f, "gauge");
        for (const auto& [labels, g] : f.gauges)
          out += fmt::format("{}{} {}\n", name, labels, g->value());
        break;
      case Kind::kHistogram: {
        header(name, f, "histogram");
        for (const auto& [labels, h] : f.histograms) {
          uint64_t cumulative = 0;
          for (int b = 0; b < Histogram::kBuckets; ++b) {
            uint64_t n = h->buckets_[b].load(std::memory_order_relaxed);
            if (n == 0) continue;
            cumulative += n;
            out +=
                fmt::format("{}_bucket{} {}\n", name,
                            withLabel(labels, "le", std::to_string(Histogram::bucketUpperBound(b))),
                            cumulative);
          }
          out += fmt::format("{}_bucket{} {}\n", name, withLabel(labels, "le", "+Inf"), h->count());
          out += fmt::format("{}_sum{} {}\n", name, labels, h->sum());
          out += fmt::format("{}_count{} {}\n", name, labels, h->count());
        }
        std::string qname = name + "_quantile";
        out += fmt::format("# TYPE {} gauge\n", qname);
        for (const auto& [labels, h] : f.histograms) {
          out += fmt::format("{}{} {}\n", qname, withLabel(labels, "quantile", "0.5"),
                             h->quantile(0.5));
          out += fmt::format("{}{} {}\n", qname, withLabel(labels, "quantile", "0.99"),
                             h->quantile(0.99));
        }
        break;
      }
    }
  }
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace cistern::metrics
