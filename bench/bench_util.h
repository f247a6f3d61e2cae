// Helpers shared by the benchmark programs: timing, figure lines, peak RSS.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace cistern::bench {

inline double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Prints `figure <name> <value> <unit>`, the line format bench/run promises.
inline void figure(const std::string& name, double value, const std::string& unit) {
  std::printf("figure %s %.3f %s\n", name.c_str(), value, unit.c_str());
  std::fflush(stdout);
}

// Prints `rounds <name>: v1 / v2 / ...`, each round's value of a figure
// whose `figure` line gives their median; bench/run records them in
// bench/results/NAME.tsv.
inline void rounds(const std::string& name, const std::vector<double>& values) {
  std::printf("rounds %s:", name.c_str());
  for (size_t i = 0; i < values.size(); ++i) std::printf("%s %.3f", i ? " /" : "", values[i]);
  std::printf("\n");
  std::fflush(stdout);
}

// The largest peak resident set (VmHWM) among processes `pids`, MiB.
inline double peakRssMiB(const std::vector<pid_t>& pids) {
  double peak = 0;
  for (pid_t pid : pids) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("VmHWM:", 0) == 0) peak = std::max(peak, std::atof(line.c_str() + 6) / 1024);
    }
  }
  return peak;
}

// Peak resident set of this process (the cistern services run in it), MiB.
inline double peakRssMiB() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

// Runs op(thread, i) on `threads` threads until `secs` pass or op returns
// false; returns ops/s over all threads. `counts` gets each thread's count.
inline double runTimed(int threads, double secs, const std::function<bool(int, uint64_t)>& op,
                       std::vector<uint64_t>* counts = nullptr) {
  std::vector<uint64_t> done(static_cast<size_t>(threads), 0);
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      while (secondsSince(t0) < secs && op(t, done[t])) done[t]++;
    });
  }
  for (auto& w : workers) w.join();
  double took = secondsSince(t0);
  uint64_t total = 0;
  for (auto d : done) total += d;
  if (counts) *counts = done;
  return static_cast<double>(total) / took;
}

}  // namespace cistern::bench
