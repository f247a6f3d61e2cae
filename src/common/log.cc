#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>

namespace cistern::log {
namespace {

Level initialLevel() {
  Level l = Level::kInfo;
  if (const char* env = std::getenv("CISTERN_LOG_LEVEL")) parseLevel(env, &l);
  return l;
}

std::atomic<int>& levelVar() {
  static std::atomic<int> v{static_cast<int>(initialLevel())};
  return v;
}

std::atomic<Sink> g_test_sink{nullptr};

spdlog::logger& logger() {
  // Logs go to stderr so that command output on stdout stays parseable.
  static std::shared_ptr<spdlog::logger> l = [] {
    auto lg = spdlog::stderr_color_mt("cistern");
    lg->set_pattern("%Y-%m-%dT%H:%M:%S.%f %^%L%$ %t %v");
    lg->set_level(spdlog::level::trace);
    return lg;
  }();
  return *l;
}

spdlog::level::level_enum toSpd(Level l) {
  switch (l) {
    case Level::kTrace:
      return spdlog::level::trace;
    case Level::kDebug:
      return spdlog::level::debug;
    case Level::kInfo:
      return spdlog::level::info;
    case Level::kWarn:
      return spdlog::level::warn;
    case Level::kError:
      return spdlog::level::err;
    case Level::kOff:
      return spdlog::level::off;
  }
  return spdlog::level::info;
}

}  // namespace

Level level() { return static_cast<Level>(levelVar().load(std::memory_order_relaxed)); }
void setLevel(Level l) { levelVar().store(static_cast<int>(l), std::memory_order_relaxed); }

namespace {
constexpr std::pair<std::string_view, Level> kLevelNames[] = {
    {"trace", Level::kTrace}, {"debug", Level::kDebug}, {"info", Level::kInfo},
    {"warn", Level::kWarn},   {"error", Level::kError}, {"off", Level::kOff}};
}  // namespace

bool parseLevel(std::string_view name, Level* out) {
  for (const auto& [n, l] : kLevelNames) {
    if (n == name) {
      *out = l;
      return true;
    }
  }
  return false;
}

std::string_view levelName(Level level) {
  for (const auto& [n, l] : kLevelNames) {
    if (l == level) return n;
  }
  return "info";
}

void write(Level l, std::string_view component, std::string_view message) {
  if (Sink s = g_test_sink.load(std::memory_order_acquire)) s(l, component, message);
  logger().log(toSpd(l), "[{}] {}", component, message);
}

void setTestSink(Sink sink) { g_test_sink.store(sink, std::memory_order_release); }

}  // namespace cistern::log
