// bench/run etcd — the metadata store on the etcd engine (a 3-member etcd
// cluster on this machine, started here) against the same on the embedded
// RocksDB KV in the same run: file creates by 8 threads in one directory,
// rounds alternating which KV goes first; and what a file costs etcd.
//
// Figures:
//   etcd_meta_create_per_s, rocksdb_meta_create_per_s: creates/s (medians)
//   etcd_create_vs_rocksdb: their ratio per round (x, median)
//   etcd_bytes_per_file: etcd's bytes in use per file created, after a
//     compaction (the history gone), on one member (B, median)
//   etcd_bench_peak_rss_mib
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "bench/bench_util.h"
#include "common/log.h"
#include "kv/etcd_client.h"
#include "kv/etcd_engine.h"
#include "meta/meta_store.h"
#include "meta/schema.h"
#include "tests/support/etcd_cluster.h"

using namespace cistern;
using namespace cistern::meta;

namespace {

void die(const Status& s, const char* what) {
  std::fprintf(stderr, "etcd bench: %s: %s\n", what, s.toString().c_str());
  std::exit(1);
}

// Creates/s by 8 threads in one new directory of `engine`; `*files`: how many.
double creates(kv::Engine& engine, double secs, uint64_t* files) {
  Status seeded = kv::runTransaction(engine, [](kv::Transaction& t) {
    for (uint32_t id = 1; id <= 4; ++id) t.set(chainKey(id), "");
    return Status::OK();
  });
  if (!seeded.ok()) die(seeded, "seed chains");
  MetaStore store(engine);
  if (Status s = store.init(); !s.ok()) die(s, "init");
  Caller root;
  auto dir = store.mkdir(root, kRootIno, "d", 0777);
  if (!dir.ok()) die(dir.status(), "mkdir");
  std::vector<uint64_t> made;
  double rate = bench::runTimed(
      8, secs,
      [&](int t, uint64_t i) {
        auto r = store.create(root, dir->ino(), "f" + std::to_string(t) + "-" + std::to_string(i),
                              0644, true);
        if (!r.ok()) die(r.status(), "create");
        return true;
      },
      &made);
  *files = 0;
  for (uint64_t m : made) *files += m;
  return rate;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  log::setLevel(log::Level::kWarn);
  double secs = argc > 1 ? std::atof(argv[1]) : 3.0;
  std::string base =
      std::filesystem::absolute("build/bench-etcd-" + std::to_string(getpid())).string();
  std::filesystem::remove_all(base);
  auto etcd = testing::EtcdCluster::start(base + "/etcd", 3);
  if (!etcd) die(Status(ErrorCode::kIOError, "no etcd cluster"), "start etcd");
  kv::etcd::Client::Options co;
  co.endpoints = {etcd->endpoint(0)};
  auto client = kv::etcd::Client::create(co);
  if (!client.ok()) die(client.status(), "etcd client");

  std::vector<double> etcd_rates, rocks_rates, ratios, bytes_per_file;
  for (int round = 0; round < 3; ++round) {
    double rates[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      const bool etcd_now = (round + k) % 2 == 0;  // alternate which goes first
      uint64_t files = 0;
      if (etcd_now) {
        auto before = (*client)->dbSize();
        if (!before.ok()) die(before.status(), "etcd status");
        kv::EtcdEngineOptions eo;
        eo.endpoints = etcd->endpoints();
        eo.prefix = "round-" + std::to_string(round) + "/";
        auto engine = kv::openEtcdEngine(eo);
        if (!engine.ok()) die(engine.status(), "open etcd engine");
        rates[0] = creates(**engine, secs, &files);
        // Compact the history away, then count what the files hold.
        auto t = (*engine)->begin();
        if (Status s = (*client)->compact(static_cast<int64_t>(t->readVersion())); !s.ok())
          die(s, "compact");
        t.reset();
        auto after = (*client)->dbSize();
        if (!after.ok()) die(after.status(), "etcd status");
        bytes_per_file.push_back(static_cast<double>(after->second - before->second) /
                                 static_cast<double>(std::max<uint64_t>(files, 1)));
      } else {
        kv::RocksEngineOptions ro;
        ro.path = base + "/rocks-" + std::to_string(round);
        auto engine = kv::openRocksEngine(ro);
        if (!engine.ok()) die(engine.status(), "open rocksdb");
        rates[1] = creates(**engine, secs, &files);
      }
    }
    etcd_rates.push_back(rates[0]);
    rocks_rates.push_back(rates[1]);
    ratios.push_back(rates[0] / rates[1]);
    std::printf("round %d: etcd %.0f creates/s, rocksdb %.0f creates/s, %.0f B/file on etcd\n",
                round + 1, rates[0], rates[1], bytes_per_file.back());
  }
  bench::rounds("etcd_meta_create_per_s", etcd_rates);
  bench::rounds("rocksdb_meta_create_per_s", rocks_rates);
  bench::rounds("etcd_create_vs_rocksdb", ratios);
  bench::rounds("etcd_bytes_per_file", bytes_per_file);
  bench::figure("etcd_meta_create_per_s", median(etcd_rates), "ops/s");
  bench::figure("rocksdb_meta_create_per_s", median(rocks_rates), "ops/s");
  bench::figure("etcd_create_vs_rocksdb", median(ratios), "x");
  bench::figure("etcd_bytes_per_file", median(bytes_per_file), "B");
  bench::figure("etcd_bench_peak_rss_mib", bench::peakRssMiB(), "MiB");
  etcd.reset();
  std::filesystem::remove_all(base);
  return 0;
}
