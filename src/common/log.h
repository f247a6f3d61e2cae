// Logging: one line per event, every line names its component ("net", "kv").
//
//   CLOG_INFO("net", "accepted {} from {}", id, peer);
//
// The macros format with fmt only when the level is enabled, and the sink
// (spdlog, behind log.cc) is kept out of this header so that every file that
// logs does not compile spdlog. Thread-safe; callable from any thread.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace cistern::log {

enum class Level : int { kTrace = 0, kDebug, kInfo, kWarn, kError, kOff };

// Level below which lines are dropped. Default: kInfo, or $CISTERN_LOG_LEVEL
// (trace|debug|info|warn|error|off) when set.
Level level();
void setLevel(Level level);
// Parses "info" etc.; returns false for an unknown name.
bool parseLevel(std::string_view name, Level* out);
// The name parseLevel() takes for `level`.
std::string_view levelName(Level level);

inline bool enabled(Level l) { return l >= level(); }
void write(Level l, std::string_view component, std::string_view message);

// A hook that receives every line written at or above the level, for tests.
using Sink = void (*)(Level, std::string_view component, std::string_view message);
void setTestSink(Sink sink);

}  // namespace cistern::log

#define CLOG(lvl, component, ...)                                        \
  do {                                                                   \
    if (::cistern::log::enabled(lvl)) {                                  \
      ::cistern::log::write(lvl, component, ::fmt::format(__VA_ARGS__)); \
    }                                                                    \
  } while (0)
#define CLOG_TRACE(c, ...) CLOG(::cistern::log::Level::kTrace, c, __VA_ARGS__)
#define CLOG_DEBUG(c, ...) CLOG(::cistern::log::Level::kDebug, c, __VA_ARGS__)
#define CLOG_INFO(c, ...) CLOG(::cistern::log::Level::kInfo, c, __VA_ARGS__)
#define CLOG_WARN(c, ...) CLOG(::cistern::log::Level::kWarn, c, __VA_ARGS__)
#define CLOG_ERROR(c, ...) CLOG(::cistern::log::Level::kError, c, __VA_ARGS__)
