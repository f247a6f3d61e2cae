// The target state machine (chain_states.h).
#include "mgmtd/chain_states.h"

#include <algorithm>

namespace cistern::mgmtd {

std::string_view stateName(TargetState s) {
  switch (s) {
    case TargetState::kServing:
      return "SERVING";
    case TargetState::kSyncing:
      return "SYNCING";
    case TargetState::kWaiting:
      return "WAITING";
    case TargetState::kOffline:
      return "OFFLINE";
    case TargetState::kLastServing:
      return "LASTSRV";
  }
  return "?";
}

std::vector<uint32_t> ChainView::serving() const {
  std::vector<uint32_t> out;
  for (const ChainMember& m : members) {
    if (m.state == TargetState::kServing) out.push_back(m.target);
  }
  return out;
}

ChainView nextChain(const ChainView& chain,
                    const std::function<TargetReport(uint32_t target)>& report) {
  struct Step {
    ChainMember m;
    TargetReport r;
    bool newly_serving = false;  // synced this step: joins at the tail
  };
  std::vector<Step> steps;
  for (const ChainMember& m : chain.members) steps.push_back({m, report(m.target)});

  // Serving targets that stay, and those that went silent now.
  int last_silent_serving = -1;
  bool lastsrv_kept = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    Step& s = steps[i];
    if (s.m.state == TargetState::kServing) {
      if (!s.r.alive) {
        s.m.state = TargetState::kOffline;
        last_silent_serving = static_cast<int>(i);
      }
    } else if (s.m.state == TargetState::kLastServing) {
      if (s.r.alive)
        s.m.state = TargetState::kServing;
      else
        lastsrv_kept = true;
    }
  }
  auto anyServing = [&] {
    return std::any_of(steps.begin(), steps.end(),
                       [](const Step& s) { return s.m.state == TargetState::kServing; });
  };
  // No serving replica left: the last to go (the tail among those that went
  // together) has every acknowledged write; the chain waits for it.
  if (!anyServing() && !lastsrv_kept && last_silent_serving >= 0)
    steps[static_cast<size_t>(last_silent_serving)].m.state = TargetState::kLastServing;
  const bool serving = anyServing();

  for (Step& s : steps) {
    if (s.m.state != TargetState::kSyncing) continue;
    if (!s.r.alive) {
      s.m.state = TargetState::kOffline;
    } else if (!serving) {
      s.m.state = TargetState::kWaiting;  // its source is gone
    } else if (s.r.synced) {
      s.m.state = TargetState::kServing;
      s.newly_serving = true;
    }
  }
  bool syncing = std::any_of(steps.begin(), steps.end(),
                             [](const Step& s) { return s.m.state == TargetState::kSyncing; });
  for (Step& s : steps) {
    if (s.m.state == TargetState::kWaiting) {
      if (!s.r.alive) {
        s.m.state = TargetState::kOffline;
      } else if (serving && !syncing) {
        s.m.state = TargetState::kSyncing;
        syncing = true;
      }
    }
  }
  // Offline targets that answer again wait (they sync from a later step on).
  for (size_t i = 0; i < steps.size(); ++i) {
    Step& s = steps[i];
    if (s.m.state == TargetState::kOffline && s.r.alive &&
        chain.members[i].state == TargetState::kOffline)
      s.m.state = TargetState::kWaiting;
  }

  auto rank = [](const Step& s) {
    switch (s.m.state) {
      case TargetState::kServing:
        return s.newly_serving ? 1 : 0;
      case TargetState::kSyncing:
        return 2;
      case TargetState::kWaiting:
        return 3;
      case TargetState::kLastServing:
        return 4;
      case TargetState::kOffline:
        return 5;
    }
    return 6;
  };
  std::stable_sort(steps.begin(), steps.end(),
                   [&](const Step& a, const Step& b) { return rank(a) < rank(b); });
  ChainView next;
  next.id = chain.id;
  for (const Step& s : steps) next.members.push_back(s.m);
  next.version = next.members == chain.members ? chain.version : chain.version + 1;
  return next;
}

}  // namespace cistern::mgmtd
