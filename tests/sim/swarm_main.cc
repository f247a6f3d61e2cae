// sim_swarm: runs simulation seeds (tests/sim/swarm wraps it).
//   sim_swarm N [FIRST]   N seeds from FIRST (default: from the clock);
//                         prints each failing seed and seeds per second
//   sim_swarm --seed S [--trace] [--bug-ack-at-head] [--bug-read-dirty]
//             [--bug-head-takes-back]
//                         replays seed S (exactly: one seed, one schedule)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/log.h"
#include "tests/sim/world.h"

int main(int argc, char** argv) {
  using namespace cistern;
  log::setLevel(log::Level::kWarn);
  sim::SimOptions o;
  long long seed = -1;
  long long count = 100;
  unsigned long long first =
      static_cast<unsigned long long>(std::chrono::system_clock::now().time_since_epoch().count());
  int positional = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seed" && i + 1 < argc) {
      seed = std::atoll(argv[++i]);
    } else if (a == "--trace") {
      o.trace = true;
    } else if (a == "--bug-ack-at-head") {
      o.bug_ack_at_head = true;
    } else if (a == "--bug-read-dirty") {
      o.bug_read_dirty = true;
    } else if (a == "--bug-head-takes-back") {
      o.bug_head_takes_back = true;
    } else if (!a.empty() && a[0] != '-' && positional == 0) {
      count = std::atoll(a.c_str());
      ++positional;
    } else if (!a.empty() && a[0] != '-' && positional == 1) {
      first = std::strtoull(a.c_str(), nullptr, 10);
      ++positional;
    } else {
      std::fprintf(stderr,
                   "usage: sim_swarm N [FIRST] | --seed S [--trace] [--bug-ack-at-head] "
                   "[--bug-read-dirty] [--bug-head-takes-back]\n");
      return 2;
    }
  }
  if (seed >= 0) {
    auto r = sim::runSimulation(static_cast<uint64_t>(seed), o);
    std::printf(
        "seed %lld: %s (%llu writes acknowledged, %llu reads checked, %llu crashes, "
        "%llu lost, %llu cut off, %llu mgmtd crashes; converged at %.1f s)\n",
        seed, r.ok ? "ok" : r.violation.c_str(), static_cast<unsigned long long>(r.writes_acked),
        static_cast<unsigned long long>(r.reads_checked),
        static_cast<unsigned long long>(r.crashes), static_cast<unsigned long long>(r.lost_nodes),
        static_cast<unsigned long long>(r.partitions),
        static_cast<unsigned long long>(r.mgmtd_crashes), r.converged_ms / 1e3);
    return r.ok ? 0 : 1;
  }
  first %= 1000000000000ULL;
  const auto start = std::chrono::steady_clock::now();
  long long failed = 0;
  for (long long i = 0; i < count; ++i) {
    const unsigned long long s = first + static_cast<unsigned long long>(i);
    auto r = sim::runSimulation(s, o);
    if (!r.ok) {
      ++failed;
      std::printf("FAILED seed %llu: %s\n  replay: tests/sim/swarm --seed %llu --trace\n", s,
                  r.violation.c_str(), s);
      std::fflush(stdout);
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%lld seeds from %llu: %lld failed, %.1f s\n", count, first, failed, secs);
  std::printf("figure sim_seeds_per_s %.1f seeds/s\n", static_cast<double>(count) / secs);
  return failed ? 1 : 0;
}
