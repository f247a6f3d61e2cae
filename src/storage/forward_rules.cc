// The forwarded-change decision (forward_rules.h).
#include "storage/forward_rules.h"

namespace cistern::storage {

ForwardAction classifyForward(ForwardKind kind, const ChunkStamp* held, ChunkStamp base,
                              ChunkStamp result) {
  switch (kind) {
    case ForwardKind::kChange: {
      const ChunkStamp have = held ? *held : ChunkStamp{};
      if (have == result) return ForwardAction::kPassOn;  // applied here before
      // A new chunk's change applies to "none"; an existing copy must be
      // exactly the base (its chain version too).
      if (have.version != base.version || (held && have.chain_version != base.chain_version))
        return ForwardAction::kMismatch;
      return ForwardAction::kApply;
    }
    case ForwardKind::kReplace:
      return held && *held == result ? ForwardAction::kPassOn : ForwardAction::kApply;
    case ForwardKind::kRemove:
      return held ? ForwardAction::kApply : ForwardAction::kPassOn;
  }
  return ForwardAction::kMismatch;
}

}  // namespace cistern::storage
