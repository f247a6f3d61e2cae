// bench/run meta — metadata operations/s with 8 threads on the RocksDB KV
// (synced commits), in-process and over RPC on loopback, next to the same
// operations on the local file system in the same run.
//
// Figures (ops/s unless noted):
//   meta_create_inproc, meta_stat_inproc, meta_unlink_inproc: one directory
//   meta_create_spread_inproc, meta_stat_spread_inproc: a directory per thread
//   meta_create_inproc_nosync: creates with sync_commits=false
//   meta_create_inproc_1thread: creates by one thread (each waits for its own sync)
//   meta_create_rpc, meta_stat_rpc: over RPC, one directory
//   meta_create_inproc_commit_batch, meta_create_rpc_commit_batch: transactions
//     per group commit in those create phases (txns)
//   localfs_create_per_s, localfs_stat_per_s: open(O_CREAT)+close, stat(2)
//   meta_create_vs_localfs, meta_stat_vs_localfs: in-process vs local (x)
//   meta_bench_peak_rss_mib
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/random.h"
#include "meta/meta_service.h"
#include "meta/schema.h"
#include "net/rpc_client.h"

using namespace cistern;
using namespace cistern::meta;

namespace {

constexpr int kThreads = 8;

double run(double secs, const std::function<bool(int, uint64_t)>& op,
           std::vector<uint64_t>* counts = nullptr, int threads = kThreads) {
  return bench::runTimed(threads, secs, op, counts);
}

// Transactions per group commit over a phase, from the KV's batch histogram
// (process-wide, so read before and after the phase).
struct BatchMeter {
  metrics::Histogram& h = metrics::Registry::global().histogram("kv_commit_batch_size");
  uint64_t batches = h.count(), txns = h.sum();
  double mean() const {
    uint64_t b = h.count() - batches;
    return b ? static_cast<double>(h.sum() - txns) / static_cast<double>(b) : 0.0;
  }
};

std::string name(int t, uint64_t i) { return "f" + std::to_string(t) + "-" + std::to_string(i); }

void die(const Status& s, const char* what) {
  std::fprintf(stderr, "meta bench: %s: %s\n", what, s.toString().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  log::setLevel(log::Level::kWarn);
  double secs = argc > 1 ? std::atof(argv[1]) : 2.0;
  std::string base =
      std::filesystem::absolute("build/bench-meta-" + std::to_string(getpid())).string();
  std::filesystem::remove_all(base);
  std::filesystem::create_directories(base + "/local");

  kv::RocksEngineOptions ko;
  ko.path = base + "/kv";
  auto engine = kv::openRocksEngine(ko);
  if (!engine.ok()) die(engine.status(), "open kv");
  Status seeded = kv::runTransaction(**engine, [](kv::Transaction& t) {
    for (uint32_t id = 1; id <= 4; ++id) t.set(chainKey(id), "");
    return Status::OK();
  });
  if (!seeded.ok()) die(seeded, "seed chains");
  MetaStore store(**engine);
  if (Status s = store.init(); !s.ok()) die(s, "init");
  Caller root;

  // --- in process, one directory
  auto dir = store.mkdir(root, kRootIno, "one", 0777);
  if (!dir.ok()) die(dir.status(), "mkdir");
  uint64_t d = dir->ino();
  std::vector<uint64_t> made;
  BatchMeter batch1;
  double create1 = run(
      secs,
      [&](int t, uint64_t i) {
        auto r = store.create(root, d, name(t, i), 0644, true);
        if (!r.ok()) die(r.status(), "create");
        return true;
      },
      &made);
  double create1_batch = batch1.mean();
  double stat1 = run(secs, [&](int t, uint64_t i) {
    thread_local Xoshiro256 rng(static_cast<uint64_t>(t) + 1);
    int owner = static_cast<int>(rng.uniform(kThreads));
    if (made[owner] == 0) return true;
    auto r = store.lookup(root, d, name(owner, rng.uniform(made[owner])));
    if (!r.ok()) die(r.status(), "lookup");
    return true;
  });
  double unlink1 = run(secs, [&](int t, uint64_t i) {
    if (i >= made[t]) return false;
    Status s = store.unlink(root, d, name(t, i));
    if (!s.ok()) die(s, "unlink");
    return true;
  });

  // --- in process, one thread: each create waits for its own commit
  auto solo_dir = store.mkdir(root, kRootIno, "solo", 0777);
  if (!solo_dir.ok()) die(solo_dir.status(), "mkdir solo");
  double create_solo = run(
      secs,
      [&](int t, uint64_t i) {
        auto r = store.create(root, solo_dir->ino(), name(t, i), 0644, true);
        if (!r.ok()) die(r.status(), "create solo");
        return true;
      },
      nullptr, 1);

  // --- in process, a directory per thread
  std::vector<uint64_t> dirs;
  for (int t = 0; t < kThreads; ++t)
    dirs.push_back(store.mkdir(root, kRootIno, "spread" + std::to_string(t), 0777)->ino());
  std::vector<uint64_t> made_spread;
  double create_spread = run(
      secs,
      [&](int t, uint64_t i) {
        auto r = store.create(root, dirs[t], name(t, i), 0644, true);
        if (!r.ok()) die(r.status(), "create spread");
        return true;
      },
      &made_spread);
  double stat_spread = run(secs, [&](int t, uint64_t i) {
    thread_local Xoshiro256 rng(static_cast<uint64_t>(t) + 100);
    if (made_spread[t] == 0) return true;
    auto r = store.lookup(root, dirs[t], name(t, rng.uniform(made_spread[t])));
    if (!r.ok()) die(r.status(), "lookup spread");
    return true;
  });

  // --- over RPC
  double create_rpc, stat_rpc, create_rpc_batch;
  {
    net::RpcServer server(net::ServerOptions{.threads = 1});
    MetaService service(store, server, 16);
    if (Status s = server.start(); !s.ok()) die(s, "rpc start");
    net::RpcClient client(net::ClientOptions{.threads = 1});
    net::Endpoint ep = server.endpoint();
    auto rpc_dir = store.mkdir(root, kRootIno, "rpc", 0777);
    uint64_t rd = rpc_dir->ino();
    net::Method create_m = net::Method::of("cistern.meta.MetaService.Create");
    net::Method lookup_m = net::Method::of("cistern.meta.MetaService.Lookup");
    BatchMeter batch_rpc;
    std::vector<uint64_t> made_rpc;
    create_rpc = run(
        secs,
        [&](int t, uint64_t i) {
          CreateReq req;
          req.set_parent(rd);
          req.set_name(name(t, i));
          req.set_mode(0644);
          req.set_exclusive(true);
          req.set_client("bench-" + std::to_string(t));
          req.set_seq(i + 1);
          InodeResp resp;
          Status s = client.callSync(ep, create_m, req, &resp);
          if (!s.ok()) die(s, "rpc create");
          return true;
        },
        &made_rpc);
    create_rpc_batch = batch_rpc.mean();
    stat_rpc = run(secs, [&](int t, uint64_t i) {
      thread_local Xoshiro256 rng(static_cast<uint64_t>(t) + 200);
      if (made_rpc[t] == 0) return true;
      LookupReq req;
      req.set_parent(rd);
      req.set_name(name(t, rng.uniform(made_rpc[t])));
      InodeResp resp;
      Status s = client.callSync(ep, lookup_m, req, &resp);
      if (!s.ok()) die(s, "rpc lookup");
      return true;
    });
    server.stop();
  }

  // --- the same creates without fsync: shows what the CPU allows
  double create_nosync;
  {
    kv::RocksEngineOptions no;
    no.path = base + "/kv-nosync";
    no.engine.sync_commits = false;
    auto e2 = kv::openRocksEngine(no);
    if (!e2.ok()) die(e2.status(), "open kv nosync");
    (void)kv::runTransaction(**e2, [](kv::Transaction& t) {
      for (uint32_t id = 1; id <= 4; ++id) t.set(chainKey(id), "");
      return Status::OK();
    });
    MetaStore s2(**e2);
    if (Status s = s2.init(); !s.ok()) die(s, "init nosync");
    uint64_t d2 = s2.mkdir(root, kRootIno, "one", 0777)->ino();
    create_nosync = run(secs, [&](int t, uint64_t i) {
      auto r = s2.create(root, d2, name(t, i), 0644, true);
      if (!r.ok()) die(r.status(), "create nosync");
      return true;
    });
  }

  // --- local file system baseline, same threads, same directory layout
  std::string local = base + "/local";
  std::vector<uint64_t> made_local;
  double create_local = run(
      secs,
      [&](int t, uint64_t i) {
        int fd = ::open((local + "/" + name(t, i)).c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
        if (fd < 0) die(Status(ErrorCode::kIOError, std::strerror(errno)), "local create");
        ::close(fd);
        return true;
      },
      &made_local);
  double stat_local = run(secs, [&](int t, uint64_t i) {
    thread_local Xoshiro256 rng(static_cast<uint64_t>(t) + 300);
    struct stat st;
    if (made_local[t] == 0) return true;
    if (::stat((local + "/" + name(t, rng.uniform(made_local[t]))).c_str(), &st) != 0) {
      die(Status(ErrorCode::kIOError, std::strerror(errno)), "local stat");
    }
    return true;
  });

  engine->reset();
  std::filesystem::remove_all(base);

  std::printf(
      "meta (8 threads, rocksdb, synced): create %.0f/s stat %.0f/s unlink %.0f/s in one dir; "
      "spread create %.0f/s stat %.0f/s; one thread create %.0f/s; rpc create %.0f/s stat %.0f/s; "
      "local fs create %.0f/s "
      "stat %.0f/s\n",
      create1, stat1, unlink1, create_spread, stat_spread, create_solo, create_rpc, stat_rpc,
      create_local, stat_local);
  bench::figure("meta_create_inproc", create1, "ops/s");
  bench::figure("meta_stat_inproc", stat1, "ops/s");
  bench::figure("meta_unlink_inproc", unlink1, "ops/s");
  bench::figure("meta_create_spread_inproc", create_spread, "ops/s");
  bench::figure("meta_create_inproc_nosync", create_nosync, "ops/s");
  bench::figure("meta_create_inproc_1thread", create_solo, "ops/s");
  bench::figure("meta_stat_spread_inproc", stat_spread, "ops/s");
  bench::figure("meta_create_rpc", create_rpc, "ops/s");
  bench::figure("meta_create_inproc_commit_batch", create1_batch, "txns");
  bench::figure("meta_create_rpc_commit_batch", create_rpc_batch, "txns");
  bench::figure("meta_stat_rpc", stat_rpc, "ops/s");
  bench::figure("localfs_create_per_s", create_local, "ops/s");
  bench::figure("localfs_stat_per_s", stat_local, "ops/s");
  bench::figure("meta_bench_peak_rss_mib", bench::peakRssMiB(), "MiB");
  bench::figure("meta_create_vs_localfs", create1 / create_local, "x");
  bench::figure("meta_stat_vs_localfs", stat1 / stat_local, "x");
  return 0;
}
