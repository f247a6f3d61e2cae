// Test helpers: the engines a test binary runs its engine-parameterized
// suites on — the local engines, or (built with CISTERN_KV_ETCD_SUITE) the
// etcd engine on a cluster the binary starts (kv_etcd_test_util.h).
#pragma once

#ifdef CISTERN_KV_ETCD_SUITE
#include "kv/kv_etcd_test_util.h"
#else
#include "kv/kv_test_util.h"
#endif

namespace cistern::kv {

inline std::vector<EngineFactory> suiteEngines() {
#ifdef CISTERN_KV_ETCD_SUITE
  return {etcdEngine()};
#else
  return allEngines();
#endif
}

}  // namespace cistern::kv
