// Helpers shared by the benchmark programs: timing, figure lines, peak RSS.
#pragma once

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace cistern::bench {

inline double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Prints `figure <name> <value> <unit>`, the line format bench/run promises.
inline void figure(const std::string& name, double value, const std::string& unit) {
  std::printf("figure %s %.3f %s\n", name.c_str(), value, unit.c_str());
  std::fflush(stdout);
}

// Peak resident set of this process (the cistern services run in it), MiB.
inline double peakRssMiB() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

}  // namespace cistern::bench
