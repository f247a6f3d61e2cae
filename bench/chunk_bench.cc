// bench/run chunk — the chunk engine next to fio on the same directory.
//
// Each side writes 256 MiB in 1 MiB blocks with 4 writers, one 64 MiB file each (every write
// durable before it returns: the engine group-commits, fio uses fdatasync=1),
// reads them back sequentially with 4 readers, and does 4 KiB random reads
// over the same 256 MiB at queue depth 32 two ways: 2 threads with 16 reads
// in flight each, through one io_uring per thread (the engine's
// startRead/finishRead around a LoopRing, the way the storage service serves
// small reads; fio: io_uring, 2 jobs, iodepth 16 — the figure), and 32
// threads with one blocking read() each (fio: psync, 32 jobs); fio reads one
// shared file, and odd rounds run fio first in every phase. Both sides use O_DIRECT (the engine's
// default on a filesystem that has it; fio --direct=1), so the page cache favours neither. The
// sequential read is run a second time through the storage RPC on loopback (4 clients, one 1 MiB
// BatchRead each at a time). Small durable writes: 16 writers each make 256 new 4 KiB chunks (small
// files), next to fio's 16 jobs appending 4 KiB blocks with fdatasync=1; the engine runs twice,
// with small writes' bytes in the metadata log (the default) and without (data fdatasync, then the
// log). Each figure is the median of the per-round ratios over ROUNDS rounds (default 8: a
// round's ratio swings 0.5-1.5x with this host's disk, and the median of 3 or 4 swung with
// it). The engine reads into and writes from memory in 2 MiB pages, as the storage service's
// payload buffers are (common/io_memory.h); fio's buffers are 4 KiB pages, which this VM's
// virtual disk serves slower, so each round also reads fio's files with pread into 2 MiB
// pages (4 threads, O_DIRECT) and prints the engine against that: the engine's own cost.
// Usage: chunk_bench [RAND_SECS] [ROUNDS]; CHUNK_BENCH_IO=psync|io_uring picks the engine's
// I/O backend for read() and writes (default io_uring; the queued reads always use io_uring).
// Figures: chunk_seqwrite_vs_fio, chunk_seqread_vs_fio, chunk_randread_vs_fio,
// chunk_randread_threads_vs_fio_psync, storage_rpc_seqread_vs_fio, chunk_smallwrite_vs_fio (x), the
// MB/s and IOPS behind them, peak RSS.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <thread>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/this_coro.hpp>

#include "bench/bench_util.h"
#include "common/io_memory.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/random.h"
#include "net/rpc_client.h"
#include "net/rpc_server.h"
#include "storage.pb.h"
#include "storage/chunk_engine.h"
#include "storage/loop_ring.h"
#include "storage/storage_service.h"

using namespace cistern;
using namespace cistern::storage;
using cistern::metrics::median;

namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint32_t kChunks = 256;             // 256 MiB
constexpr uint32_t kPerThread = kChunks / 4;  // each of 4 threads: one file of 64 chunks

// The i-th chunk of the benchmark: chunk i % 64 of file (inode) 1 + i / 64.
ChunkId chunkOf(uint32_t i) { return ChunkId{1 + i / kPerThread, i % kPerThread}; }

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

// Runs fn(0) .. fn(threads - 1) on threads of their own, started together
// once all are running (fio does not count its start-up either); returns the
// seconds from that start to the last one's end.
double parallel(int threads, const std::function<void(int)>& fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      ++ready;
      while (!go.load()) std::this_thread::yield();
      fn(t);
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  auto t0 = std::chrono::steady_clock::now();
  go = true;
  for (auto& t : ts) t.join();
  return bench::secondsSince(t0);
}

// 4 KiB random reads over the benchmark's chunks for `secs` seconds from 2
// threads, each with 16 reads in flight through its own io_uring: the
// engine's startRead()/finishRead() around a LoopRing, as StorageService
// serves small reads. A read whose record is not in memory (or that must be
// done again) uses read(), as the service hands it to its pool. Returns
// reads per second.
double queuedRandReads(ChunkEngine& e, double secs, int round,
                       const std::function<ChunkId(uint32_t)>& id) {
  constexpr int kThreads = 2, kDepth = 16;
  std::atomic<uint64_t> reads{0}, blocking{0};
  double took = parallel(kThreads, [&](int t) {
    asio::io_context ctx(1);
    auto t0 = std::chrono::steady_clock::now();
    for (int d = 0; d < kDepth; ++d) {
      asio::co_spawn(
          ctx,
          [&, d]() -> asio::awaitable<void> {
            LoopRing* ring = LoopRing::forThread(co_await asio::this_coro::executor);
            if (!ring) {
              std::fprintf(stderr, "chunk bench: no io_uring for the queued reads\n");
              std::exit(1);
            }
            Xoshiro256 rng(static_cast<uint64_t>(t * kDepth + d) +
                           1000u * static_cast<uint64_t>(round));
            // 4 KiB-aligned, as the service's pooled reply buffers are (the
            // disk's bytes land in them without a copy).
            std::unique_ptr<uint8_t, decltype(&std::free)> mem(
                static_cast<uint8_t*>(std::aligned_alloc(4096, 4096)), &std::free);
            std::span<uint8_t> out(mem.get(), 4096);
            ChunkEngine::AsyncRead a;
            int results[2];
            uint64_t n = 0;
            while (bench::secondsSince(t0) < secs) {
              ChunkId c = id(static_cast<uint32_t>(rng.uniform(kChunks)));
              uint64_t off = rng.uniform(256) * 4096;
              auto started = e.startRead(c, off, out, a);
              bool done = started.ok() && *started && **started == out.size();
              if (done && !a.io().empty()) {
                co_await ring->run(a.io(), {results, a.io().size()});
                done = e.finishRead(a, {results, a.io().size()});
              }
              if (!done) {
                ++blocking;
                if (!e.read(c, off, out).ok()) std::exit(1);
              }
              ++n;
            }
            reads += n;
          },
          asio::detached);
    }
    ctx.run();
  });
  if (blocking.load() * 10 > reads.load()) {
    std::fprintf(stderr, "chunk bench: %llu of %llu queued reads were blocking reads\n",
                 static_cast<unsigned long long>(blocking.load()),
                 static_cast<unsigned long long>(reads.load()));
  }
  return static_cast<double>(reads.load()) / took;
}

}  // namespace

int main(int argc, char** argv) {
  log::setLevel(log::Level::kWarn);
  double rand_secs = argc > 1 ? std::atof(argv[1]) : 3.0;
  int rounds = argc > 2 ? std::atoi(argv[2]) : 8;  // even: each order runs as often
  if (!(rand_secs >= 1)) {  // fio takes whole seconds; --runtime=0 would not end
    std::fprintf(stderr, "chunk bench: RAND_SECS must be at least 1, not '%s'\n", argv[1]);
    return 2;
  }
  if (rounds < 1) {
    std::fprintf(stderr, "chunk bench: ROUNDS must be a positive number, not '%s'\n", argv[2]);
    return 2;
  }
  std::string base =
      std::filesystem::absolute("build/bench-chunk-" + std::to_string(getpid())).string();
  std::filesystem::remove_all(base);
  std::filesystem::create_directories(base + "/fio");

  ChunkEngineOptions o;
  o.path = base + "/target";
  if (const char* io = std::getenv("CHUNK_BENCH_IO")) o.io_engine = io;
  auto engine = ChunkEngine::open(o);
  if (!engine.ok()) {
    std::fprintf(stderr, "chunk bench: %s\n", engine.status().toString().c_str());
    return 1;
  }
  ChunkEngine& e = **engine;
  ChunkEngineOptions unlogged_o = o;
  unlogged_o.path = base + "/target-unlogged";
  unlogged_o.log_small_writes = false;
  auto unlogged = ChunkEngine::open(unlogged_o);
  if (!unlogged.ok()) {
    std::fprintf(stderr, "chunk bench: %s\n", unlogged.status().toString().c_str());
    return 1;
  }
  net::RpcServer server(net::ServerOptions{.threads = 1});
  StorageService service(e, server);
  if (!server.start().ok()) return 1;
  net::RpcClient client;
  const auto kBatchRead = net::Method::of("cistern.storage.StorageService.BatchRead");
  const std::string fio_base = "--directory=" + base + "/fio --direct=1 --thread --group_reporting";
  const std::string common = fio_base + " --ioengine=psync";
  // The random reads: fio's engine and depth are added per comparison.
  const std::string rand_common = fio_base +
                                  " --name=r --filename=rand --rw=randread --bs=4k --size=256m "
                                  "--time_based --runtime=" +
                                  std::to_string(static_cast<int>(rand_secs));
  // Written as the storage service writes a request's payload: from a
  // buffer in 2 MiB pages that does not change during the call.
  io_memory::Region block_mem(kMiB);
  std::memset(block_mem.data(), 0x5a, kMiB);
  std::span<const uint8_t> block(block_mem.data(), kMiB);

  // The disk's speed drifts on a shared machine, so each round measures the
  // engine and fio back to back and the figures are the medians of the
  // per-round ratios. Round r writes files 4r+1..4r+4 (fresh chunks).
  std::vector<double> w_ratio, r_ratio, raw_ratio, rr_ratio, rrt_ratio, rpc_ratio, sw_ratio,
      swu_ratio;
  double eng_write = 0, eng_read = 0, eng_iops = 0, eng_threads_iops = 0, rpc_read = 0,
         raw_read = 0, fio_write = 0, fio_read = 0, fio_iops = 0, fio_threads_iops = 0;
  for (int round = 0; round < rounds; ++round) {
    auto id = [&](uint32_t i) {
      ChunkId c = chunkOf(i);
      c.inode += static_cast<uint64_t>(round) * 4;
      return c;
    };
    // Odd rounds run fio first: whichever side wrote last, or reads first,
    // may find the disk (or the host under it) in a different state.
    const bool fio_first = round % 2 == 1;
    auto engineWrite = [&] {
      double secs = parallel(4, [&](int t) {
        for (uint32_t i = static_cast<uint32_t>(t) * kPerThread; i < (t + 1) * kPerThread; ++i) {
          if (!e.write(id(i), 0, block, 1, /*stable=*/true).ok()) std::exit(1);
        }
      });
      eng_write = kChunks * kMiB / secs;
    };
    auto fioWrite = [&] {
      std::filesystem::remove_all(base + "/fio");
      std::filesystem::create_directories(base + "/fio");
      fio_write =
          fio(common + " --name=w --rw=write --bs=1m --size=64m --numjobs=4 --fdatasync=1").first;
    };
    if (fio_first) fioWrite();
    engineWrite();
    if (!fio_first) fioWrite();
    w_ratio.push_back(eng_write / fio_write);

    auto engineRead = [&] {
      dropCaches();
      double secs = parallel(4, [&](int t) {
        // As the storage service reads a batch: into a pooled payload
        // buffer, in 2 MiB pages.
        io_memory::Region buf(kMiB);
        std::span<uint8_t> out(buf.data(), kMiB);
        for (uint32_t i = static_cast<uint32_t>(t) * kPerThread; i < (t + 1) * kPerThread; ++i) {
          if (!e.read(id(i), 0, out).ok()) std::exit(1);
        }
      });
      eng_read = kChunks * kMiB / secs;
    };
    auto fioRead = [&] {
      dropCaches();
      fio_read = fio(common + " --name=w --rw=read --bs=1m --size=64m --numjobs=4").first;
    };
    // fio's files again, read the way the engine reads: into 2 MiB pages
    // (between the other two, whichever goes first).
    auto rawRead = [&] {
      dropCaches();
      double raw_secs = parallel(4, [&](int t) {
        const std::string path = base + "/fio/w." + std::to_string(t) + ".0";
        int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
        if (fd < 0) {
          std::perror(path.c_str());
          std::exit(1);
        }
        io_memory::Region buf(kMiB);
        for (uint32_t i = 0; i < kPerThread; ++i) {
          if (::pread(fd, buf.data(), kMiB, off_t{i} * kMiB) != static_cast<ssize_t>(kMiB)) {
            std::perror(path.c_str());
            std::exit(1);
          }
        }
        ::close(fd);
      });
      raw_read = kChunks * kMiB / raw_secs;
    };
    if (fio_first) fioRead();
    if (!fio_first) engineRead();
    rawRead();
    if (fio_first) engineRead();
    if (!fio_first) fioRead();
    r_ratio.push_back(eng_read / fio_read);
    raw_ratio.push_back(eng_read / raw_read);

    dropCaches();
    double took = parallel(4, [&](int t) {
      std::vector<uint8_t> out(kMiB);
      for (uint32_t i = static_cast<uint32_t>(t) * kPerThread; i < (t + 1) * kPerThread; ++i) {
        BatchReadReq req;
        auto* r = req.add_ranges();
        r->mutable_chunk()->set_inode(id(i).inode);
        r->mutable_chunk()->set_index(id(i).index);
        r->set_length(kMiB);
        BatchReadResp resp;
        size_t got = 0;
        Status s = client.callSync(server.endpoint(), kBatchRead, req, &resp,
                                   {.response_payload = out, .response_payload_len = &got});
        if (!s.ok() || got != kMiB) {
          std::fprintf(stderr, "chunk bench: rpc read: %s\n", s.toString().c_str());
          std::exit(1);
        }
      }
    });
    rpc_read = kChunks * kMiB / took;
    rpc_ratio.push_back(rpc_read / fio_read);

    // Random reads alternate which side goes first too. At queue depth 32
    // both ways: 2 threads with 16 reads each in flight through one
    // io_uring per thread (the engine's asynchronous reads, as the storage
    // service serves small reads; fio --ioengine=io_uring --iodepth=16
    // --numjobs=2), and 32 threads with one blocking read each (the
    // engine's read(); fio psync, 32 jobs).
    auto engineRandRead = [&] {
      dropCaches();
      eng_iops = queuedRandReads(e, rand_secs, round, [&](uint32_t i) { return id(i); });
    };
    auto engineRandReadThreads = [&] {
      dropCaches();
      std::atomic<uint64_t> reads{0};
      double secs = parallel(32, [&](int t) {
        Xoshiro256 rng(static_cast<uint64_t>(t) + 100u * static_cast<uint64_t>(round));
        std::vector<uint8_t> out(4096);
        auto t0 = std::chrono::steady_clock::now();
        uint64_t n = 0;
        while (bench::secondsSince(t0) < rand_secs) {
          if (!e.read(id(static_cast<uint32_t>(rng.uniform(kChunks))), rng.uniform(256) * 4096, out)
                   .ok())
            std::exit(1);
          ++n;
        }
        reads += n;
      });
      eng_threads_iops = static_cast<double>(reads.load()) / secs;
    };
    auto fioRandRead = [&] {
      dropCaches();
      fio_iops = fio(rand_common + " --ioengine=io_uring --iodepth=16 --numjobs=2").second;
    };
    auto fioRandReadThreads = [&] {
      dropCaches();
      fio_threads_iops = fio(rand_common + " --ioengine=psync --numjobs=32").second;
    };
    if (fio_first) fioRandRead();
    engineRandRead();
    if (!fio_first) fioRandRead();
    rr_ratio.push_back(eng_iops / fio_iops);
    if (fio_first) fioRandReadThreads();
    engineRandReadThreads();
    if (!fio_first) fioRandReadThreads();
    rrt_ratio.push_back(eng_threads_iops / fio_threads_iops);

    // Small durable writes: 16 x 256 new 4 KiB chunks, on inodes of their own.
    std::vector<uint8_t> small(4096, 0x3c);
    auto smallWrites = [&](ChunkEngine& engine) {
      return 16 * 256 / parallel(16, [&](int t) {
               for (uint32_t i = 0; i < 256; ++i) {
                 ChunkId c{1000000 + static_cast<uint64_t>(round) * 16 + static_cast<uint64_t>(t),
                           i};
                 if (!engine.write(c, 0, small, 1).ok()) std::exit(1);
               }
             });
    };
    double small_logged = smallWrites(e), small_unlogged = smallWrites(**unlogged);
    std::filesystem::remove_all(base + "/fio");
    std::filesystem::create_directories(base + "/fio");
    double fio_small =
        fio(common + " --name=s --rw=write --bs=4k --size=1m --numjobs=16 --fdatasync=1").second;
    sw_ratio.push_back(small_logged / fio_small);
    swu_ratio.push_back(small_unlogged / fio_small);
    std::printf(
        "round %d: small writes/s: engine %.0f (data in the log), %.0f (data synced); fio %.0f\n",
        round, small_logged, small_unlogged, fio_small);
    std::printf(
        "round %d: engine write %.0f MB/s, read %.0f MB/s, rpc read %.0f MB/s, 4K randread %.0f "
        "IOPS (32 threads: %.0f); fio write %.0f MB/s, read %.0f MB/s, randread %.0f IOPS "
        "(psync, 32 jobs: %.0f); pread into 2 MiB pages %.0f MB/s\n",
        round, eng_write / 1e6, eng_read / 1e6, rpc_read / 1e6, eng_iops, eng_threads_iops,
        fio_write / 1e6, fio_read / 1e6, fio_iops, fio_threads_iops, raw_read / 1e6);
  }
  server.stop();
  unlogged->reset();
  engine->reset();  // flushed before its directory goes (the service is stopped)
  std::filesystem::remove_all(base);

  std::printf("small writes with data synced instead of logged: %.2fx fio\n", median(swu_ratio));
  // The spread behind each median: one round's ratio swings with the host.
  std::printf("seqread against pread into 2 MiB pages: %.2fx\n", median(raw_ratio));
  bench::rounds("chunk_seqwrite_vs_fio", w_ratio);
  bench::rounds("chunk_seqread_vs_fio", r_ratio);
  bench::rounds("chunk_seqread_vs_pread_2mib_pages", raw_ratio);
  bench::rounds("chunk_randread_vs_fio", rr_ratio);
  bench::rounds("chunk_randread_threads_vs_fio_psync", rrt_ratio);
  bench::rounds("storage_rpc_seqread_vs_fio", rpc_ratio);
  bench::rounds("chunk_smallwrite_vs_fio", sw_ratio);
  bench::figure("chunk_bench_peak_rss_mib", bench::peakRssMiB(), "MiB");
  bench::figure("chunk_seqwrite_vs_fio", median(w_ratio), "x");
  bench::figure("chunk_seqread_vs_fio", median(r_ratio), "x");
  bench::figure("chunk_randread_vs_fio", median(rr_ratio), "x");
  bench::figure("chunk_randread_threads_vs_fio_psync", median(rrt_ratio), "x");
  bench::figure("storage_rpc_seqread_vs_fio", median(rpc_ratio), "x");
  bench::figure("chunk_smallwrite_vs_fio", median(sw_ratio), "x");
  return 0;
}
