// Named fault points.
//
//   RETURN_ON_ERROR(CISTERN_FAULT("storage.write.after_data"));
//
// A fault point is a name in the code that a test can switch on to return an
// error, sleep, or kill the process there. When no fault is enabled anywhere
// in the process, CISTERN_FAULT is one relaxed atomic load and yields an ok
// Status. Faults are enabled from code (fault::enable) or, for child processes
// and whole-cluster tests, from $CISTERN_FAULTS read at start-up:
//
//   CISTERN_FAULTS="kv.commit.before_write=crash@skip=100;net.send=delay:20ms@p=0.1"
//
// Syntax: entries separated by ';', each `name=action[@opt,opt...]` where
// action is `error[:kCode]`, `delay:<n>ms|us|s` or `crash`, and options are
// `skip=N` (let N hits pass first), `times=N` (fire at most N times; default
// unlimited) and `p=F` (fire with probability F). Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/status.h"

namespace cistern::fault {

enum class Action { kError, kDelay, kCrash };

struct Spec {
  Action action = Action::kError;
  // Returned by kError. Default: kFaultInjected.
  ErrorCode code = ErrorCode::kFaultInjected;
  // Slept by kDelay.
  Duration delay{0};
  // Hits that pass before the fault starts firing. Default: 0.
  uint64_t skip = 0;
  // Maximum number of times it fires; 0 = unlimited. Default: 0.
  uint64_t times = 0;
  // Probability that an eligible hit fires. Default: 1.
  double probability = 1.0;
};

void enable(const std::string& name, const Spec& spec);
void disable(const std::string& name);
void disableAll();
// Number of times the named fault fired since it was enabled.
uint64_t fired(const std::string& name);
// Parses the $CISTERN_FAULTS syntax and enables each entry; on a syntax error
// nothing is enabled and the error names the bad entry.
Status enableFromString(std::string_view specs);

// Slow path behind CISTERN_FAULT; do not call directly.
Status check(std::string_view name);
extern std::atomic<int> g_enabled_count;

}  // namespace cistern::fault

#define CISTERN_FAULT(name)                                                                    \
  (__builtin_expect(::cistern::fault::g_enabled_count.load(std::memory_order_relaxed) == 0, 1) \
       ? ::cistern::Status()                                                                   \
       : ::cistern::fault::check(name))
