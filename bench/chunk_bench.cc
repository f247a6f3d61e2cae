// bench/run chunk — the chunk engine next to fio on the same directory.
//
// Each side writes 1 MiB blocks sequentially with 4 writers (every write
// durable before it returns: the engine group-commits, fio uses fdatasync=1),
// reads them back sequentially, and does 4 KiB random reads with 32 readers
// (fio: 32 jobs, psync). Page caches are dropped before reads when allowed.
// Figures: chunk_seqwrite_vs_fio, chunk_seqread_vs_fio, chunk_randread_vs_fio (x),
// and the absolute MB/s and IOPS behind them, plus peak RSS.
// The storage RPC figure (storage_rpc_seqread_vs_fio) comes with the storage service.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "common/log.h"
#include "common/random.h"
#include "storage/chunk_engine.h"

using namespace cistern;
using namespace cistern::storage;

namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint32_t kChunks = 256;  // 256 MiB

void dropCaches() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (f) f << "3\n";
}

// Runs fio and returns (bandwidth bytes/s, iops) summed over jobs.
std::pair<double, double> fio(const std::string& args) {
  std::string cmd = "fio --output-format=json " + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {0, 0};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  auto j = nlohmann::json::parse(out, nullptr, false);
  if (j.is_discarded()) {
    std::fprintf(stderr, "chunk bench: fio output did not parse: %s\n", cmd.c_str());
    std::exit(1);
  }
  double bw = 0, iops = 0;
  for (auto& job : j["jobs"]) {
    for (const char* dir : {"read", "write"}) {
      bw += job[dir]["bw_bytes"].get<double>();
      iops += job[dir]["iops"].get<double>();
    }
  }
  return {bw, iops};
}

double parallel(int threads, const std::function<void(int)>& fn) {
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) ts.emplace_back(fn, t);
  for (auto& t : ts) t.join();
  return bench::secondsSince(t0);
}

}  // namespace

int main(int argc, char** argv) {
  log::setLevel(log::Level::kWarn);
  double rand_secs = argc > 1 ? std::atof(argv[1]) : 5.0;
  std::string base = std::filesystem::absolute("build/bench-chunk-" + std::to_string(getpid())).string();
  std::filesystem::remove_all(base);
  std::filesystem::create_directories(base + "/fio");

  double eng_write, eng_read, eng_iops;
  {
    ChunkEngineOptions o;
    o.path = base + "/target";
    auto engine = ChunkEngine::open(o);
    if (!engine.ok()) {
      std::fprintf(stderr, "chunk bench: %s\n", engine.status().toString().c_str());
      return 1;
    }
    ChunkEngine& e = **engine;
    std::vector<uint8_t> block(kMiB, 0x5a);
    double took = parallel(4, [&](int t) {
      for (uint32_t i = static_cast<uint32_t>(t); i < kChunks; i += 4) {
        if (!e.write({1, i}, 0, block, 1).ok()) std::exit(1);
      }
    });
    eng_write = kChunks * kMiB / took;
    dropCaches();
    took = parallel(4, [&](int t) {
      std::vector<uint8_t> out(kMiB);
      for (uint32_t i = static_cast<uint32_t>(t); i < kChunks; i += 4) {
        if (!e.read({1, i}, 0, out).ok()) std::exit(1);
      }
    });
    eng_read = kChunks * kMiB / took;
    dropCaches();
    std::atomic<uint64_t> reads{0};
    took = parallel(32, [&](int t) {
      Xoshiro256 rng(static_cast<uint64_t>(t));
      std::vector<uint8_t> out(4096);
      auto t0 = std::chrono::steady_clock::now();
      uint64_t n = 0;
      while (bench::secondsSince(t0) < rand_secs) {
        if (!e.read({1, static_cast<uint32_t>(rng.uniform(kChunks))}, rng.uniform(256) * 4096, out).ok()) std::exit(1);
        ++n;
      }
      reads += n;
    });
    eng_iops = static_cast<double>(reads.load()) / took;
  }

  std::string dir = "--directory=" + base + "/fio";
  auto [fio_write, w_iops] = fio(dir + " --name=w --rw=write --bs=1m --size=64m --numjobs=4 --ioengine=psync --fdatasync=1 --group_reporting");
  dropCaches();
  auto [fio_read, r_iops] = fio(dir + " --name=w --rw=read --bs=1m --size=64m --numjobs=4 --ioengine=psync --group_reporting");
  dropCaches();
  auto [rbw, fio_iops] = fio(dir + " --name=w --rw=randread --bs=4k --size=64m --numjobs=32 --ioengine=psync --time_based --runtime=" +
                             std::to_string(static_cast<int>(rand_secs)) + " --group_reporting");
  (void)w_iops;
  (void)r_iops;
  (void)rbw;
  std::filesystem::remove_all(base);

  std::printf("chunk engine: write %.0f MB/s, read %.0f MB/s, 4K randread %.0f IOPS; fio: write %.0f MB/s, read %.0f MB/s, randread %.0f IOPS\n",
              eng_write / 1e6, eng_read / 1e6, eng_iops, fio_write / 1e6, fio_read / 1e6, fio_iops);
  bench::figure("chunk_seqwrite_mbps", eng_write / 1e6, "MB/s");
  bench::figure("fio_seqwrite_mbps", fio_write / 1e6, "MB/s");
  bench::figure("chunk_seqread_mbps", eng_read / 1e6, "MB/s");
  bench::figure("fio_seqread_mbps", fio_read / 1e6, "MB/s");
  bench::figure("chunk_randread_iops", eng_iops, "IOPS");
  bench::figure("fio_randread_iops", fio_iops, "IOPS");
  bench::figure("chunk_bench_peak_rss_mib", bench::peakRssMiB(), "MiB");
  bench::figure("chunk_seqwrite_vs_fio", eng_write / fio_write, "x");
  bench::figure("chunk_seqread_vs_fio", eng_read / fio_read, "x");
  bench::figure("chunk_randread_vs_fio", eng_iops / fio_iops, "x");
  return 0;
}
