// What a replica does with a change forwarded down its chain, given what it
// holds of the chunk (docs/chain_protocol.md, "Write path"). Pure: the
// storage service (storage_chains.cc, onForward) and the deterministic
// simulation (tests/sim) decide with this one function.
#pragma once

#include <cstdint>

namespace cistern::storage {

enum class ForwardKind {
  kChange,   // WRITE or TRUNCATE: applies to `base`, makes `result`
  kReplace,  // REPLACE: a replica's whole copy at `result`
  kRemove,   // REMOVE
};

// A chunk version as the chain names it: the chunk's version and the chain
// version it was written under (one content on every replica).
struct ChunkStamp {
  uint64_t version = 0;
  uint64_t chain_version = 0;
  bool operator==(const ChunkStamp&) const = default;
};

enum class ForwardAction {
  kApply,     // apply it here, then pass it on
  kPassOn,    // held already (a duplicate, or the same copy): only pass it on
  kMismatch,  // holds another version than the change applies to: the
              // predecessor sends its whole copy (kChunkVersionMismatch)
};

// `held`: the replica's copy, if any. For kChange, `base` is the version
// the change applies to (none when the chunk was new: version 0) and
// `result` the one it makes; for kReplace `result` is the copy's.
ForwardAction classifyForward(ForwardKind kind, const ChunkStamp* held, ChunkStamp base,
                              ChunkStamp result);

}  // namespace cistern::storage
