// What a storage server knows of its chains (chain_table.h).
#include "storage/chain_table.h"

#include <fmt/format.h>

#include "mgmt.pb.h"

namespace cistern::storage {

void ChainTable::setTarget(uint32_t target) {
  std::lock_guard lock(mu_);
  target_ = target;
}

void ChainTable::registered(uint32_t target, uint64_t routing_version) {
  std::lock_guard lock(mu_);
  target_ = target;
  registered_version_ = routing_version;
  routing_version_ = 0;
  seen_ = false;
  positions_.clear();
  fenced_ = true;  // until a routing from after the registration says otherwise
}

uint32_t ChainTable::target() const {
  std::lock_guard lock(mu_);
  return target_;
}

uint64_t ChainTable::routingVersion() const {
  std::lock_guard lock(mu_);
  return routing_version_;
}

Status ChainTable::update(const mgmt::Routing& routing) {
  std::map<uint32_t, std::string> endpoints;
  std::lock_guard lock(mu_);
  bool restarted = false;
  for (const auto& t : routing.targets()) {
    endpoints[t.id()] = t.endpoint();
    if (t.id() == target_) restarted = t.restarted();
  }
  if (seen_ && routing.version() <= routing_version_) return Status::OK();
  if (routing.version() < registered_version_) return Status::OK();  // from before it registered
  std::map<uint32_t, ChainPosition> positions;
  for (const auto& c : routing.chains()) {
    int self = -1;
    for (int i = 0; i < c.members_size(); ++i) {
      if (c.members(i).target() == target_) self = i;
    }
    if (self < 0) continue;
    ChainPosition p;
    p.chain = c.id();
    p.version = c.version();
    const auto state = c.members(self).state();
    p.serving = state == mgmt::SERVING;
    p.syncing = state == mgmt::SYNCING;
    p.head = p.serving && c.targets_size() > 0 && c.targets(0) == target_;
    for (int i = 0; i < c.members_size(); ++i) {
      if (i == self || c.members(i).state() != mgmt::SERVING) continue;
      if (auto ep = endpoints.find(c.members(i).target()); ep != endpoints.end())
        p.serving_peers.push_back(ep->second);
    }
    // Members that take changes come first (SERVING, then SYNCING).
    if ((p.serving || p.syncing) && self + 1 < c.members_size()) {
      const auto& next = c.members(self + 1);
      if (next.state() == mgmt::SERVING || next.state() == mgmt::SYNCING) {
        auto ep = endpoints.find(next.target());
        if (ep == endpoints.end()) {
          return Status(ErrorCode::kInvalidArgument,
                        fmt::format("routing {}: chain {} names unknown target {}",
                                    routing.version(), c.id(), next.target()));
        }
        p.successor = next.target();
        p.successor_endpoint = ep->second;
        p.successor_syncing = next.state() == mgmt::SYNCING;
      }
    }
    positions[p.chain] = std::move(p);
  }
  positions_ = std::move(positions);
  fenced_ = restarted;
  routing_version_ = routing.version();
  seen_ = true;
  return Status::OK();
}

std::optional<ChainPosition> ChainTable::position(uint32_t chain) const {
  std::lock_guard lock(mu_);
  auto it = positions_.find(chain);
  if (it == positions_.end() || fenced_) return std::nullopt;
  return it->second;
}

std::vector<ChainPosition> ChainTable::syncsToRun() const {
  std::vector<ChainPosition> out;
  std::lock_guard lock(mu_);
  if (fenced_) return out;
  for (const auto& [id, p] : positions_) {
    if (p.serving && p.successor_syncing) out.push_back(p);
  }
  return out;
}

void ChainTable::renewLease(SteadyTime sent, uint32_t heartbeat_timeout_ms) {
  std::lock_guard lock(mu_);
  lease_until_ = std::max(lease_until_, sent + std::chrono::milliseconds(heartbeat_timeout_ms / 2));
}

bool ChainTable::leased() const {
  std::lock_guard lock(mu_);
  return clock_.now() < lease_until_;
}

Result<ChainPosition> ChainTable::serving(uint32_t chain, uint64_t chain_version) const {
  if (!leased()) {
    return Status(ErrorCode::kNotServing,
                  fmt::format("target {} has not heard from mgmtd within half the heartbeat "
                              "timeout; it serves nothing until it does",
                              target()));
  }
  auto p = position(chain);
  if (!p || !p->serving) {
    return Status(ErrorCode::kNotServing,
                  fmt::format("target {} is not a serving member of chain {}", target(), chain));
  }
  if (p->version != chain_version) {
    return Status(ErrorCode::kStaleChainVersion,
                  fmt::format("chain {}: routed with version {}, target {} has {}", chain,
                              chain_version, target(), p->version));
  }
  return *p;
}

}  // namespace cistern::storage
