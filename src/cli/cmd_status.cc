// `cistern status [--json]`: nodes, targets (their state in each chain,
// space, health), chains (version, members and states) and a one-line
// verdict; `cistern chains create`: lays out a cluster's chains once;
// `cistern chains history`: the chain versions mgmtd committed;
// `cistern rebalance` and `cistern drain NODE`: move replicas.
// All talk to mgmtd directly (GetRouting, CreateChains, Rebalance) and to each
// target's storage service (Space).
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>

#include "cli/commands.h"
#include "cli/remote.h"
#include "mgmt.pb.h"
#include "net/rpc_client.h"
#include "storage.pb.h"

namespace cistern::cli {
namespace {

// The mgmtd endpoints of --cluster (or $CISTERN_CLUSTER): "h:p[,h:p...]".
Result<std::vector<net::Endpoint>> mgmtdEndpoints(const std::string& flag) {
  std::string list = flag;
  if (list.empty()) {
    const char* env = std::getenv("CISTERN_CLUSTER");
    list = env && *env ? env : "127.0.0.1:7420";
  }
  std::vector<net::Endpoint> out;
  for (size_t at = 0; at <= list.size();) {
    size_t comma = std::min(list.find(',', at), list.size());
    ASSIGN_OR_RETURN(auto ep, net::Endpoint::parse(list.substr(at, comma - at)));
    out.push_back(ep);
    at = comma + 1;
  }
  return out;
}

// mgmtdEndpoints(), or nullopt after printing why (exit code 2).
// Calls mgmtd's `method` on whichever of `eps` is the primary (a standby
// answers kNotPrimary).
Status callPrimary(net::RpcClient& rpc, const std::vector<net::Endpoint>& eps, const char* method,
                   const google::protobuf::Message& req, google::protobuf::Message* resp,
                   uint32_t timeout_ms) {
  Status s(ErrorCode::kConnectionFailed, "no mgmtd endpoint");
  for (const auto& ep : eps) {
    s = rpc.callSync(ep, net::Method::of(std::string("cistern.mgmt.MgmtService.") + method), req,
                     resp, {.timeout_ms = timeout_ms});
    if (s.code() != ErrorCode::kNotPrimary && s.code() != ErrorCode::kConnectionFailed) break;
  }
  return s;
}

// Asks the primary mgmtd for a rebalance and prints its plan (and whether
// it started), or the error (exit status 1).
void runRebalance(net::RpcClient& rpc, const std::vector<net::Endpoint>& eps,
                  const mgmt::RebalanceReq& req, uint32_t timeout_ms, const std::string& what) {
  mgmt::RebalanceResp resp;
  if (Status s = callPrimary(rpc, eps, "Rebalance", req, &resp, timeout_ms); !s.ok()) {
    fmt::print(stderr, "cistern: {}: {}\n", what, s.toString());
    setExitCode(1);
    return;
  }
  const bool dry_run = req.dry_run();
  if (resp.moves_size() == 0) {
    fmt::print("nothing to move\n");
    return;
  }
  for (const auto& m : resp.moves())
    fmt::print("chain {}: target {} -> target {}\n", m.chain(), m.from(), m.to());
  fmt::print("{} moves {} (routing version {})\n", resp.moves_size(),
             dry_run ? "planned (dry run: nothing changed)" : "started", resp.routing_version());
}

std::optional<std::vector<net::Endpoint>> mgmtdEndpointsOrReport(const std::string& flag) {
  auto eps = mgmtdEndpoints(flag);
  if (!eps.ok()) {
    fmt::print(stderr, "cistern: --cluster: {}\n", eps.status().message());
    setExitCode(2);
    return std::nullopt;
  }
  return std::move(*eps);
}

const char* stateName(mgmt::TargetState s) {
  switch (s) {
    case mgmt::SERVING:
      return "SERVING";
    case mgmt::SYNCING:
      return "SYNCING";
    case mgmt::WAITING:
      return "WAITING";
    case mgmt::OFFLINE:
      return "OFFLINE";
    case mgmt::LASTSRV:
      return "LASTSRV";
    default:
      return "?";
  }
}

std::string jsonText(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

struct TargetRow {
  const mgmt::Target* t = nullptr;
  bool reachable = false;
  storage::SpaceResp space;
  std::vector<std::pair<uint32_t, mgmt::TargetState>> states;  // (chain, state)
};

// A chain's members with their states (a one-machine chain lists only its
// serving targets).
std::vector<std::pair<uint32_t, mgmt::TargetState>> membersOf(const mgmt::Chain& c) {
  std::vector<std::pair<uint32_t, mgmt::TargetState>> out;
  if (c.members_size() == 0) {
    for (uint32_t t : c.targets()) out.push_back({t, mgmt::SERVING});
  } else {
    for (const auto& m : c.members()) out.push_back({m.target(), m.state()});
  }
  return out;
}

void printStatus(const mgmt::Routing& r, std::vector<TargetRow>& rows, bool json) {
  uint64_t chunks = 0, data = 0;
  int bad_targets = 0, degraded = 0;
  size_t replication = 0;
  for (const auto& row : rows) {
    if (!row.reachable || row.space.failed()) ++bad_targets;
    chunks += row.space.chunks();
    data += row.space.data_bytes();
  }
  for (const auto& c : r.chains()) {
    const auto members = membersOf(c);
    replication = std::max(replication, members.size());
    if (static_cast<size_t>(c.targets_size()) < members.size() || c.targets_size() == 0) ++degraded;
  }
  const bool healthy = bad_targets == 0 && degraded == 0;
  std::map<std::string, std::vector<uint32_t>> nodes;  // name -> targets
  for (const auto& row : rows) nodes[row.t->node()].push_back(row.t->id());
  if (json) {
    fmt::print("{{\"routing_version\": {}, \"healthy\": {}, \"meta\": [", r.version(), healthy);
    for (int i = 0; i < r.meta_endpoints_size(); ++i)
      fmt::print("{}{}", i ? ", " : "", jsonText(r.meta_endpoints(i)));
    fmt::print("],\n \"nodes\": [");
    bool first = true;
    for (const auto& [name, targets] : nodes) {
      fmt::print("{}{{\"name\": {}, \"targets\": [{}]}}", first ? "" : ", ", jsonText(name),
                 fmt::join(targets, ", "));
      first = false;
    }
    fmt::print("],\n \"targets\": [");
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& row = rows[i];
      fmt::print(
          "{}\n  {{\"id\": {}, \"node\": {}, \"endpoint\": {}, \"path\": {}, \"reachable\": {}, "
          "\"failed\": {}, \"fs_total_bytes\": {}, \"fs_free_bytes\": {}, \"chunks\": {}, "
          "\"data_bytes\": {}, \"chains\": {{",
          i ? "," : "", row.t->id(), jsonText(row.t->node()), jsonText(row.t->endpoint()),
          jsonText(row.t->path()), row.reachable, row.space.failed(), row.space.fs_total_bytes(),
          row.space.fs_free_bytes(), row.space.chunks(), row.space.data_bytes());
      for (size_t j = 0; j < row.states.size(); ++j)
        fmt::print("{}\"{}\": \"{}\"", j ? ", " : "", row.states[j].first,
                   stateName(row.states[j].second));
      fmt::print("}}}}");
    }
    fmt::print("],\n \"chains\": [");
    for (int i = 0; i < r.chains_size(); ++i) {
      const auto& c = r.chains(i);
      fmt::print("{}\n  {{\"id\": {}, \"version\": {}, \"members\": [", i ? "," : "", c.id(),
                 c.version());
      const auto members = membersOf(c);
      for (size_t j = 0; j < members.size(); ++j)
        fmt::print("{}{{\"target\": {}, \"state\": \"{}\"}}", j ? ", " : "", members[j].first,
                   stateName(members[j].second));
      fmt::print("]}}");
    }
    fmt::print("]}}\n");
    if (!healthy) setExitCode(1);
    return;
  }
  if (nodes.size() > 1 || !nodes.begin()->first.empty()) {
    fmt::print("{:<12} {}\n", "node", "targets");
    for (const auto& [name, targets] : nodes)
      fmt::print("{:<12} {}\n", name.empty() ? "-" : name, fmt::join(targets, " "));
    fmt::print("\n");
  }
  fmt::print("{:>6} {:<8} {:<22} {:<9} {:>10} {:>10} {:>10} {:>10} {:>12}  {:<24} {}\n", "target",
             "node", "endpoint", "health", "fs size", "fs free", "kept", "chunks", "data",
             "chains (state)", "path");
  for (const auto& row : rows) {
    const char* health = !row.reachable ? "DOWN" : row.space.failed() ? "FAILED" : "ok";
    std::string states;
    for (auto [chain, state] : row.states)
      states += fmt::format("{}{}:{}", states.empty() ? "" : " ", chain, stateName(state));
    fmt::print("{:>6} {:<8} {:<22} {:<9} {:>10} {:>10} {:>10} {:>10} {:>12}  {:<24} {}\n",
               row.t->id(), row.t->node().empty() ? "-" : row.t->node(), row.t->endpoint(), health,
               humanBytes(static_cast<double>(row.space.fs_total_bytes())),
               humanBytes(static_cast<double>(row.space.fs_free_bytes())),
               humanBytes(static_cast<double>(row.space.kept_bytes())), row.space.chunks(),
               humanBytes(static_cast<double>(row.space.data_bytes())), states, row.t->path());
  }
  if (replication > 1) {
    fmt::print("\n{:>6} {:>8}  {}\n", "chain", "version", "members, head first (state)");
    for (const auto& c : r.chains()) {
      std::string members;
      for (auto [t, state] : membersOf(c))
        members += fmt::format("{}{}:{}", members.empty() ? "" : " ", t, stateName(state));
      fmt::print("{:>6} {:>8}  {}\n", c.id(), c.version(), members);
    }
  }
  fmt::print(
      "{} targets, {} chains (replication {}), {} chunks, {} of data; {}\n", rows.size(),
      r.chains_size(), replication, chunks, humanBytes(static_cast<double>(data)),
      healthy ? "healthy"
              : fmt::format("{} target(s) unhealthy, {} chain(s) degraded", bad_targets, degraded));
  if (!healthy) setExitCode(1);
}

}  // namespace

void addStatusCommands(CLI::App& app) {
  {
    auto* cmd = app.add_subcommand("status", "nodes, targets, chains, capacity and health");
    auto& flags = addClusterFlags(cmd);
    static bool json = false;
    cmd->add_flag("--json", json, "one JSON document instead of tables");
    cmd->callback([&flags] {
      auto eps = mgmtdEndpointsOrReport(flags.cluster);
      if (!eps) return;
      net::RpcClient rpc{net::ClientOptions{}};
      if (!carryToken(rpc, flags)) return;
      mgmt::Routing r;
      Status s;
      for (const auto& ep : *eps) {  // any mgmtd answers GetRouting
        s = rpc.callSync(ep, net::Method::of("cistern.mgmt.MgmtService.GetRouting"),
                         mgmt::GetRoutingReq(), &r, {.timeout_ms = flags.retry_ms});
        if (s.ok()) break;
      }
      if (!s.ok()) {
        fmt::print(stderr, "cistern: cluster {}: {}\n", flags.cluster, s.toString());
        setExitCode(1);
        return;
      }
      std::vector<TargetRow> rows;
      for (const auto& t : r.targets()) {
        TargetRow row;
        row.t = &t;
        for (const auto& c : r.chains()) {
          for (auto [target, state] : membersOf(c))
            if (target == t.id()) row.states.push_back({c.id(), state});
        }
        if (auto ep = net::Endpoint::parse(t.endpoint()); ep.ok()) {
          row.reachable = rpc.callSync(*ep, net::Method::of("cistern.storage.StorageService.Space"),
                                       storage::SpaceReq(), &row.space, {.timeout_ms = 3000})
                              .ok();
        }
        rows.push_back(std::move(row));
      }
      printStatus(r, rows, json);
    });
  }
  {
    auto* cmd = app.add_subcommand("chains", "a cluster's chain table");
    cmd->require_subcommand(1);
    auto* create = cmd->add_subcommand(
        "create", "lay out the chains over the registered storage targets (once)");
    auto& flags = addClusterFlags(create);
    static uint32_t replication = 3, count = 0;
    create->add_option("--replication", replication, "replicas per chain (1-5)")
        ->capture_default_str();
    create->add_option("--count", count, "chains (default: as many as targets)");
    create->callback([&flags] {
      auto eps = mgmtdEndpointsOrReport(flags.cluster);
      if (!eps) return;
      net::RpcClient rpc{net::ClientOptions{}};
      if (!carryToken(rpc, flags)) return;
      mgmt::CreateChainsReq req;
      req.set_replication(replication);
      req.set_chains(count);
      if (count == 0) {
        mgmt::Routing r;
        if (rpc.callSync((*eps)[0], net::Method::of("cistern.mgmt.MgmtService.GetRouting"),
                         mgmt::GetRoutingReq(), &r)
                .ok())
          req.set_chains(static_cast<uint32_t>(r.targets_size()));
      }
      mgmt::CreateChainsResp resp;
      Status s = callPrimary(rpc, *eps, "CreateChains", req, &resp, flags.retry_ms);
      if (!s.ok()) {
        fmt::print(stderr, "cistern: chains create: {}\n", s.toString());
        setExitCode(1);
        return;
      }
      fmt::print("{} chains of {} replicas (routing version {})\n", resp.chains_size(), replication,
                 resp.routing_version());
    });
    auto* history = cmd->add_subcommand(
        "history",
        "the chain versions mgmtd committed (each chain's last 64): what a rebalance, "
        "a replacement or a failover did, step by step");
    auto& hflags = addClusterFlags(history);
    static uint32_t only = 0;
    history->add_option("--chain", only, "one chain's (default: every chain's)");
    history->callback([&hflags] {
      auto eps = mgmtdEndpointsOrReport(hflags.cluster);
      if (!eps) return;
      net::RpcClient rpc{net::ClientOptions{}};
      if (!carryToken(rpc, hflags)) return;
      mgmt::ChainHistoryReq req;
      req.set_chain(only);
      mgmt::ChainHistoryResp resp;
      if (Status s = callPrimary(rpc, *eps, "ChainHistory", req, &resp, hflags.retry_ms); !s.ok()) {
        fmt::print(stderr, "cistern: chains history: {}\n", s.toString());
        setExitCode(1);
        return;
      }
      for (const auto& e : resp.events()) {
        const auto& c = e.chain();
        std::string members;
        for (const auto& m : c.members())
          members +=
              fmt::format("{}{}:{}", members.empty() ? "" : " ", m.target(), stateName(m.state()));
        if (c.members_size() == 0)
          for (uint32_t t : c.targets())
            members += fmt::format("{}{}:SERVING", members.empty() ? "" : " ", t);
        const std::chrono::sys_seconds at{std::chrono::seconds(e.unix_ms() / 1000)};
        fmt::print("chain {} v{}  {:%FT%T}.{:03}Z  {}{}\n", c.id(), c.version(), at,
                   e.unix_ms() % 1000, members,
                   c.leaving() ? fmt::format("  (target {} leaving)", c.leaving()) : "");
      }
      if (resp.events_size() == 0) fmt::print("no chain versions recorded\n");
    });
  }
  {
    auto* cmd = app.add_subcommand(
        "rebalance",
        "move replicas so that targets are within --spread chains of each other (a new node "
        "gets its share): each new replica syncs before the old one leaves");
    auto& flags = addClusterFlags(cmd);
    static bool dry_run = false;
    static uint32_t spread = 1;
    cmd->add_flag("--dry-run", dry_run, "print the plan, change nothing");
    cmd->add_option("--spread", spread, "chains a target may hold more than another")
        ->capture_default_str();
    cmd->callback([&flags] {
      auto eps = mgmtdEndpointsOrReport(flags.cluster);
      if (!eps) return;
      net::RpcClient rpc{net::ClientOptions{}};
      if (!carryToken(rpc, flags)) return;
      mgmt::RebalanceReq req;
      req.set_dry_run(dry_run);
      req.set_spread(spread);
      runRebalance(rpc, *eps, req, flags.retry_ms, "rebalance");
    });
  }
  {
    auto* cmd = app.add_subcommand(
        "drain", "move every replica off a storage node (before removing it); it gets no new ones");
    auto& flags = addClusterFlags(cmd);
    static std::string node;
    static bool dry_run = false;
    cmd->add_option("NODE", node, "the node's name (storage.node)")->required();
    cmd->add_flag("--dry-run", dry_run, "print the plan, change nothing");
    cmd->callback([&flags] {
      auto eps = mgmtdEndpointsOrReport(flags.cluster);
      if (!eps) return;
      net::RpcClient rpc{net::ClientOptions{}};
      if (!carryToken(rpc, flags)) return;
      mgmt::RebalanceReq req;
      req.set_dry_run(dry_run);
      req.set_spread(UINT32_MAX);  // only the drain's moves
      req.add_drain(node);
      runRebalance(rpc, *eps, req, flags.retry_ms, "drain " + node);
    });
  }
}

}  // namespace cistern::cli
