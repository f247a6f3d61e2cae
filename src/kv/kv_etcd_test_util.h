// Test helpers: the etcd engine on a 3-member etcd cluster that the test
// binary starts once, on loopback (tests/support/etcd_cluster.h); each
// engine gets a key prefix of its own, so tests share the cluster.
#pragma once

#include <unistd.h>

#include "kv/etcd_engine.h"
#include "kv/kv_test_util.h"
#include "tests/support/etcd_cluster.h"

namespace cistern::kv {

// The binary's etcd cluster (started on first use; null if it cannot be).
inline testing::EtcdCluster* sharedEtcd() {
  static std::unique_ptr<testing::EtcdCluster> cluster = testing::EtcdCluster::start(
      ::testing::TempDir() + "/cistern-etcd-" + std::to_string(::getpid()), 3);
  return cluster.get();
}

inline EngineFactory etcdEngine() {
  return {"etcd",
          [](const std::string& dir, const EngineOptions& o) -> std::unique_ptr<Engine> {
            testing::EtcdCluster* etcd = sharedEtcd();
            EXPECT_NE(etcd, nullptr) << "no etcd cluster";
            if (!etcd) return nullptr;
            EtcdEngineOptions eo;
            eo.engine = o;
            eo.endpoints = etcd->endpoints();
            eo.prefix = dir + "/";  // the same directory: the same data (reopen)
            auto r = openEtcdEngine(eo);
            EXPECT_TRUE(r.ok()) << r.status().toString();
            return r.ok() ? std::move(r).value() : nullptr;
          },
          true, 50};
}

}  // namespace cistern::kv
