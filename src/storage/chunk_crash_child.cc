// Child process for chunk_crash_test: changes chunks in a loop until killed
// (truncate, rewrite, overwrite in the middle, append: chunk_crash_content.h).
// Chunk i at version v always holds crashContent(i, v), so the parent can tell
// exactly which committed version it sees. After each acknowledged write the
// child prints "<index> <version>".
//
//   chunk_crash_child TARGET_DIR SEED [power-loss|unsynced]
//
// power-loss: a log big enough that no checkpoint runs and at most 200
// writes, then the child waits to be killed; the parent then puts back the
// class-0 group files as they were before the run (the page cache lost),
// and the metadata log must bring every logged write back.
// unsynced: half the writes are unsynced (write(..., durable = false)), and
// the engine syncs them every 2 ms: a kill of the process must lose none.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/random.h"
#include "storage/chunk_crash_content.h"
#include "storage/chunk_engine.h"

using namespace cistern::storage;

int main(int argc, char** argv) {
  const bool power_loss = argc == 4 && std::strcmp(argv[3], "power-loss") == 0;
  const bool unsynced = argc == 4 && std::strcmp(argv[3], "unsynced") == 0;
  if (argc != 3 && !power_loss && !unsynced) {
    std::fprintf(stderr, "usage: chunk_crash_child TARGET_DIR SEED [power-loss|unsynced]\n");
    return 2;
  }
  ChunkEngineOptions o;
  o.path = argv[1];
  o.group_bytes = 1 << 20;
  if (power_loss) {
    o.meta_log_segment_bytes = 64 << 20;  // 200 writes of at most 300 KiB fill less than half
    o.logged_held_slots_max = 1 << 30;
  }
  if (unsynced) o.sync_interval_ms = 2;
  auto engine = ChunkEngine::open(o);
  if (!engine.ok()) {
    std::fprintf(stderr, "open: %s\n", engine.status().toString().c_str());
    return 1;
  }
  cistern::Xoshiro256 rng(std::strtoull(argv[2], nullptr, 10));
  for (int writes = 0;; ++writes) {
    if (power_loss && writes == 200) pause();
    uint32_t index = static_cast<uint32_t>(rng.uniform(kCrashChunks));
    auto meta = (*engine)->query({kCrashInode, index});
    if (!meta.ok()) return 1;
    uint64_t version = (*meta ? (*meta)->chunk_version : 0) + 1;
    CrashOp op = crashOp(index, version);
    auto m = op.kind == CrashOp::kTruncate
                 ? (*engine)->truncate({kCrashInode, index}, op.length, 1)
                 : (*engine)->write({kCrashInode, index}, op.offset, op.bytes, 1, false, 0,
                                    /*durable=*/!unsynced || rng.uniform(2) == 0);
    if (!m.ok() || m->chunk_version != version) {
      std::fprintf(stderr, "write: %s\n", m.status().toString().c_str());
      return 1;
    }
    std::printf("%u %llu\n", index, static_cast<unsigned long long>(version));
    std::fflush(stdout);
    if (rng.uniform(3) == 0) {
      // Removed if it exists, else written whole (so it always holds the
      // content of its length).
      uint32_t j = static_cast<uint32_t>(rng.uniform(kScratchChunks));
      auto exists = (*engine)->query({kScratchInode, j});
      if (!exists.ok()) return 1;
      cistern::Status s;
      if (*exists) {
        s = (*engine)->remove({kScratchInode, j});
      } else {
        uint64_t length = 1 + rng.uniform(5 << 19);  // up to 2.5 MiB: classes 0 to 6
        s = (*engine)
                ->write({kScratchInode, j}, 0, scratchContent(j, length), 1, false, 0,
                        /*durable=*/!unsynced || rng.uniform(2) == 0)
                .status();
      }
      if (!s.ok()) {
        std::fprintf(stderr, "scratch: %s\n", s.toString().c_str());
        return 1;
      }
    }
  }
}
