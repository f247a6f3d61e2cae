// The states of a chain's targets and how mgmtd moves them
// (docs/chain_protocol.md, "Target states", which has the same table).
//
//   SERVING  in the chain's write path and readable; the serving targets,
//            in chain order, are head ... tail.
//   SYNCING  alive, behind: its predecessor (the tail) streams it every
//            chunk it lacks or holds older, and forwards it new writes;
//            not read. Becomes SERVING, at the tail, when the sync is done.
//   WAITING  alive, behind, not syncing yet (one target of a chain syncs at
//            a time; none can while the chain has no serving target).
//   OFFLINE  not heard from within the heartbeat timeout.
//   LASTSRV  the last SERVING target of its chain when that went silent: it
//            holds the newest data, so the chain waits for it (writes and
//            reads fail) rather than serve older data from another replica;
//            back, it is SERVING and the others sync from it.
//
// One step (nextChain) applies what mgmtd now knows of each target:
//
//   state    | alive                                  | silent
//   ---------+----------------------------------------+---------------------
//   SERVING  | SERVING                                | OFFLINE; LASTSRV if
//            |                                        | no SERVING is left
//   LASTSRV  | SERVING                                | LASTSRV
//   SYNCING  | SERVING once synced; WAITING if the    | OFFLINE
//            | chain has no SERVING target; else same |
//   WAITING  | SYNCING if the chain has a SERVING     | OFFLINE
//            | target and no other SYNCING; else same |
//   OFFLINE  | WAITING                                | OFFLINE
//
// Order after a step: SERVING (in their old order, a newly synced target
// last), SYNCING, WAITING, LASTSRV, OFFLINE. The chain's version goes up by
// one when anything changed. Pure: no clock, no I/O.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace cistern::mgmtd {

enum class TargetState { kServing, kSyncing, kWaiting, kOffline, kLastServing };
std::string_view stateName(TargetState s);

struct ChainMember {
  uint32_t target = 0;
  TargetState state = TargetState::kServing;
  bool operator==(const ChainMember&) const = default;
};

struct ChainView {
  uint32_t id = 0;
  uint64_t version = 0;
  std::vector<ChainMember> members;  // chain order
  // The serving targets, head first.
  std::vector<uint32_t> serving() const;
};

// What mgmtd knows of a target now.
struct TargetReport {
  bool alive = false;   // heard from within the heartbeat timeout
  bool synced = false;  // a SYNCING target's sync finished
};

ChainView nextChain(const ChainView& chain,
                    const std::function<TargetReport(uint32_t target)>& report);

}  // namespace cistern::mgmtd
