// MetaGcLoop: the background work of a meta server, on a thread of its own
// until destroyed: chunk GC (meta/gc_worker.h) through `remover` while there
// is work and every second otherwise, ending the sessions of clients silent
// past the session timeout (every quarter of it, at most every second), and
// expiring old mutation records (every second). One machine runs one; a
// cluster runs one per meta server (each step is a KV transaction, and
// removing chunks twice is harmless).
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>

#include "server/gc_remover.h"

namespace cistern::kv {
class Engine;
}
namespace cistern::meta {
class MetaStore;
}

namespace cistern::server {

class MetaGcLoop {
 public:
  MetaGcLoop(kv::Engine& kv, meta::MetaStore& meta, GcRemover& remover);
  ~MetaGcLoop();

 private:
  void run();

  kv::Engine& kv_;
  meta::MetaStore& meta_;
  GcRemover& remover_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace cistern::server
