#include "common/fault.h"

#include <fmt/format.h>

#include <charconv>
#include <csignal>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "common/log.h"
#include "common/random.h"

namespace cistern::fault {

std::atomic<int> g_enabled_count{0};

namespace {

struct Point {
  Spec spec;
  uint64_t hits = 0;
  uint64_t fired = 0;
};

struct Table {
  std::mutex mu;
  std::map<std::string, Point, std::less<>> points;
};

Table& table() {
  static Table* t = [] {
    auto* tab = new Table();
    return tab;
  }();
  return *t;
}

// Reads $CISTERN_FAULTS once, before main() runs any fault point.
struct EnvLoader {
  EnvLoader() {
    if (const char* env = std::getenv("CISTERN_FAULTS")) {
      Status s = enableFromString(env);
      if (!s.ok()) {
        std::fprintf(stderr, "cistern: ignoring CISTERN_FAULTS: %s\n", s.toString().c_str());
      }
    }
  }
} g_env_loader;

bool parseU64(std::string_view s, uint64_t* out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

Status parseEntry(std::string_view entry, std::string* name, Spec* spec) {
  auto bad = [&](std::string_view why) {
    return Status(ErrorCode::kInvalidArgument, fmt::format("fault spec '{}': {}", entry, why));
  };
  size_t eq = entry.find('=');
  if (eq == std::string_view::npos || eq == 0) return bad("expected name=action");
  *name = std::string(entry.substr(0, eq));
  std::string_view rest = entry.substr(eq + 1);
  std::string_view opts;
  if (size_t at = rest.find('@'); at != std::string_view::npos) {
    opts = rest.substr(at + 1);
    rest = rest.substr(0, at);
  }
  std::string_view action = rest, arg;
  if (size_t colon = rest.find(':'); colon != std::string_view::npos) {
    action = rest.substr(0, colon);
    arg = rest.substr(colon + 1);
  }
  if (action == "crash") {
    spec->action = Action::kCrash;
  } else if (action == "error") {
    spec->action = Action::kError;
    if (!arg.empty()) {
      bool found = false;
      for (uint16_t v = 0; v < 1000 && !found; ++v) {
        if (isKnownErrorCode(v) && errorCodeName(static_cast<ErrorCode>(v)) == arg) {
          spec->code = static_cast<ErrorCode>(v);
          found = true;
        }
      }
      if (!found) return bad("unknown error code");
    }
  } else if (action == "delay") {
    spec->action = Action::kDelay;
    uint64_t n = 0;
    std::string_view unit;
    size_t i = 0;
    while (i < arg.size() && arg[i] >= '0' && arg[i] <= '9') ++i;
    if (i == 0 || !parseU64(arg.substr(0, i), &n)) return bad("delay needs a number");
    unit = arg.substr(i);
    if (unit == "ms")
      spec->delay = std::chrono::milliseconds(n);
    else if (unit == "us")
      spec->delay = std::chrono::microseconds(n);
    else if (unit == "s")
      spec->delay = std::chrono::seconds(n);
    else
      return bad("delay unit must be us, ms or s");
  } else {
    return bad("action must be error, delay or crash");
  }
  while (!opts.empty()) {
    size_t comma = opts.find(',');
    std::string_view opt = opts.substr(0, comma);
    opts = comma == std::string_view::npos ? std::string_view() : opts.substr(comma + 1);
    size_t oeq = opt.find('=');
    if (oeq == std::string_view::npos) return bad("option must be key=value");
    std::string_view k = opt.substr(0, oeq), v = opt.substr(oeq + 1);
    if (k == "skip") {
      if (!parseU64(v, &spec->skip)) return bad("skip must be an integer");
    } else if (k == "times") {
      if (!parseU64(v, &spec->times)) return bad("times must be an integer");
    } else if (k == "p") {
      char* end = nullptr;
      std::string tmp(v);
      spec->probability = std::strtod(tmp.c_str(), &end);
      if (end != tmp.c_str() + tmp.size() || spec->probability < 0 || spec->probability > 1) {
        return bad("p must be a number in [0, 1]");
      }
    } else {
      return bad("unknown option");
    }
  }
  return Status::OK();
}

}  // namespace

void enable(const std::string& name, const Spec& spec) {
  Table& t = table();
  std::lock_guard lock(t.mu);
  auto [it, inserted] = t.points.insert_or_assign(name, Point{spec, 0, 0});
  if (inserted) g_enabled_count.fetch_add(1, std::memory_order_relaxed);
}

void disable(const std::string& name) {
  Table& t = table();
  std::lock_guard lock(t.mu);
  if (t.points.erase(name) > 0) g_enabled_count.fetch_sub(1, std::memory_order_relaxed);
}

void disableAll() {
  Table& t = table();
  std::lock_guard lock(t.mu);
  g_enabled_count.fetch_sub(static_cast<int>(t.points.size()), std::memory_order_relaxed);
  t.points.clear();
}

uint64_t fired(const std::string& name) {
  Table& t = table();
  std::lock_guard lock(t.mu);
  auto it = t.points.find(name);
  return it == t.points.end() ? 0 : it->second.fired;
}

Status enableFromString(std::string_view specs) {
  std::vector<std::pair<std::string, Spec>> parsed;
  while (!specs.empty()) {
    size_t semi = specs.find(';');
    std::string_view entry = specs.substr(0, semi);
    specs = semi == std::string_view::npos ? std::string_view() : specs.substr(semi + 1);
    if (entry.empty()) continue;
    std::string name;
    Spec spec;
    RETURN_ON_ERROR(parseEntry(entry, &name, &spec));
    parsed.emplace_back(std::move(name), spec);
  }
  for (auto& [name, spec] : parsed) enable(name, spec);
  return Status::OK();
}

Status check(std::string_view name) {
  Spec spec;
  {
    Table& t = table();
    std::lock_guard lock(t.mu);
    auto it = t.points.find(name);
    if (it == t.points.end()) return Status::OK();
    Point& p = it->second;
    ++p.hits;
    if (p.hits <= p.spec.skip) return Status::OK();
    if (p.spec.times != 0 && p.fired >= p.spec.times) return Status::OK();
    if (p.spec.probability < 1.0 && threadLocalRandom().unit() >= p.spec.probability) {
      return Status::OK();
    }
    ++p.fired;
    spec = p.spec;
  }
  switch (spec.action) {
    case Action::kError:
      return Status(spec.code, fmt::format("fault point {}", name));
    case Action::kDelay:
      SystemClock::instance().sleepFor(spec.delay);
      return Status::OK();
    case Action::kCrash:
      CLOG_WARN("fault", "fault point {} kills the process", name);
      std::raise(SIGKILL);
      std::abort();
  }
  return Status::OK();
}

}  // namespace cistern::fault
