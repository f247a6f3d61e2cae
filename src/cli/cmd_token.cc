// `cistern token keygen|issue|inspect|revoke|whoami` and `cistern tenant
// create|ls|rm` (auth/token.h, docs/security.md): a key line for a
// cluster's key file, a signed token for a tenant, what a token says (and
// whether the keys verify it) — these need no cluster — and, through a
// cluster's meta, revoking a token, who the caller's token says it is, and
// the tenants.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <ctime>

#include "auth/token.h"
#include "cli/commands.h"
#include "cli/remote.h"

namespace cistern::cli {

void addTokenCommands(CLI::App& app) {
  auto* cmd = app.add_subcommand("token", "tenants' access tokens (HMAC-SHA256 signed)");
  cmd->require_subcommand(1);
  {
    auto* keygen = cmd->add_subcommand(
        "keygen", "print a new key line ('ID HEX') for a key file (chmod 600; two keys at most)");
    static uint32_t id = 1;
    keygen->add_option("--id", id, "the key's id (tokens name it)")->capture_default_str();
    keygen->callback([] {
      if (id == 0) {
        fmt::print(stderr, "cistern: token keygen: --id 0 (ids start at 1)\n");
        setExitCode(2);
        return;
      }
      fmt::print("{}\n", auth::Keyring::generateLine(id));
    });
  }
  {
    auto* issue =
        cmd->add_subcommand("issue", "print a token signed with the key file's first key");
    static std::string keys, tenant, rights = "rw";
    static uint32_t uid = 0, gid = 0;
    static int64_t ttl_s = 86400;
    issue->add_option("--keys", keys, "the key file")->required();
    issue->add_option("--tenant", tenant, "the tenant it acts for")->required();
    issue->add_option("--uid", uid, "the uid its calls act as")->capture_default_str();
    issue->add_option("--gid", gid, "the gid its calls act as")->capture_default_str();
    issue->add_option("--rights", rights, "r (read), w (write), a (admin)")->capture_default_str();
    issue->add_option("--ttl", ttl_s, "seconds until it expires")->capture_default_str();
    issue->callback([] {
      auto ring = auth::Keyring::load(keys);
      auto r = auth::parseRights(rights);
      Status bad = !ring.ok() ? ring.status() : !r.ok() ? r.status() : Status::OK();
      if (bad.ok() && ttl_s <= 0) bad = Status(ErrorCode::kInvalidArgument, "--ttl must be > 0");
      if (bad.ok()) bad = auth::checkTenantName(tenant);
      if (!bad.ok()) {
        fmt::print(stderr, "cistern: token issue: {}\n", bad.message());
        setExitCode(2);
        return;
      }
      auth::Token t;
      t.tenant = tenant;
      t.uid = uid;
      t.gid = gid;
      t.rights = *r;
      t.issued_unix_s = static_cast<int64_t>(std::time(nullptr));
      t.expires_unix_s = t.issued_unix_s + ttl_s;
      auto text = ring->sign(t);
      if (!text.ok()) {
        fmt::print(stderr, "cistern: token issue: {}\n", text.status().message());
        setExitCode(1);
        return;
      }
      fmt::print("{}\n", *text);
    });
  }
  {
    auto* inspect = cmd->add_subcommand("inspect",
                                        "check a token with the key file and print what it says "
                                        "(exit 1, with the reason, when it is refused)");
    static std::string token, keys;
    inspect->add_option("TOKEN", token, "the token")->required();
    inspect->add_option("--keys", keys, "the key file")->required();
    inspect->callback([] {
      const int64_t now = static_cast<int64_t>(std::time(nullptr));
      auto ring = auth::Keyring::load(keys);
      if (!ring.ok()) {
        fmt::print(stderr, "cistern: token inspect: {}\n", ring.status().message());
        setExitCode(2);
        return;
      }
      auto t = ring->verify(token, now);
      if (!t.ok()) {
        fmt::print("refused: {}: {}\n", errorCodeName(t.status().code()), t.status().message());
        setExitCode(1);
        return;
      }
      fmt::print("{} {:016x} of tenant {}: uid {} gid {}, rights {}, key {}, expires in {} s\n",
                 t->kind == auth::Kind::kToken ? "token" : "capability", t->id, t->tenant, t->uid,
                 t->gid, auth::rightsText(t->rights), t->key_id, t->expires_unix_s - now);
    });
  }
  {
    auto* revoke = cmd->add_subcommand(
        "revoke", "refuse a token from now until it expires (needs a cluster admin's token)");
    auto& flags = addClusterFlags(revoke);
    static std::string token;
    revoke->add_option("TOKEN", token, "the token to revoke (its text)")->required();
    revoke->callback([&flags] {
      auto t = auth::peek(token);
      if (!t.ok() || t->kind != auth::Kind::kToken) {
        fmt::print(stderr, "cistern: token revoke: not a token: {}\n",
                   t.ok() ? "a capability" : t.status().message());
        setExitCode(2);
        return;
      }
      auto c = connectOrReport(flags);
      if (!c) return;
      if (report(c->revokeToken(t->id, t->expires_unix_s))) return;
      fmt::print("revoked token {:016x} of tenant {} (it expires in {} s)\n", t->id, t->tenant,
                 t->expires_unix_s - static_cast<int64_t>(std::time(nullptr)));
    });
  }
  {
    auto* who = cmd->add_subcommand("whoami", "what the cluster says this client's token is");
    auto& flags = addClusterFlags(who);
    who->callback([&flags] {
      auto c = connectOrReport(flags);
      if (!c) return;
      Identity id;
      if (report(c->whoami(&id))) return;
      if (!id.checked) {
        fmt::print("the cluster does not check tokens\n");
        return;
      }
      fmt::print("tenant {}: uid {} gid {}, rights {}, token {:016x}, expires in {} s\n", id.tenant,
                 id.uid, id.gid, auth::rightsText(id.rights), id.token_id,
                 id.expires_unix_s - static_cast<int64_t>(std::time(nullptr)));
    });
  }
}

void addTenantCommands(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "tenant", "tenants: each owns a subtree its tokens are confined to (admin token)");
  cmd->require_subcommand(1);
  {
    auto* create = cmd->add_subcommand("create", "make a tenant and its root directory");
    auto& flags = addClusterFlags(create);
    static std::string name, dir;
    static uint32_t uid = 0, gid = 0;
    static std::string mode = "755";
    create->add_option("NAME", name, "[a-z0-9._-]{1,64}")->required();
    create->add_option("--dir", dir, "its root directory, created (default: /NAME)");
    create->add_option("--uid", uid, "owner of the root directory")->capture_default_str();
    create->add_option("--gid", gid, "group of the root directory")->capture_default_str();
    create->add_option("--mode", mode, "mode of the root directory (octal digits)")
        ->capture_default_str();
    create->callback([&flags] {
      auto c = connectOrReport(flags);
      if (!c) return;
      uint32_t octal = 0;
      const bool bad_mode = mode.empty() || mode.size() > 4 ||
                            mode.find_first_not_of("01234567") != std::string::npos;
      if (bad_mode) {
        fmt::print(stderr, "cistern: tenant create: --mode {} is not an octal mode\n", mode);
        setExitCode(2);
        return;
      }
      for (char ch : mode) octal = octal * 8 + static_cast<uint32_t>(ch - '0');
      TenantInfo t;
      const std::string where = remotePath(dir.empty() ? name : dir);
      if (report(c->tenantCreate(name, where, uid, gid, octal, &t))) return;
      fmt::print("tenant {} (id {}): root {} (inode {})\n", t.name, t.id, where, t.root);
    });
  }
  {
    auto* ls = cmd->add_subcommand("ls", "list the tenants");
    auto& flags = addClusterFlags(ls);
    ls->callback([&flags] {
      auto c = connectOrReport(flags);
      if (!c) return;
      std::vector<TenantInfo> all;
      if (report(c->tenantList(&all))) return;
      fmt::print("{:<24} {:>6} {:>12}\n", "TENANT", "ID", "ROOT INODE");
      for (const auto& t : all) fmt::print("{:<24} {:>6} {:>12}\n", t.name, t.id, t.root);
    });
  }
  {
    auto* rm = cmd->add_subcommand(
        "rm", "remove a tenant: its tokens stop working; its directory and files stay");
    auto& flags = addClusterFlags(rm);
    static std::string name;
    rm->add_option("NAME", name, "the tenant")->required();
    rm->callback([&flags] {
      auto c = connectOrReport(flags);
      if (!c) return;
      report(c->tenantRemove(name));
    });
  }
  addTenantQuotaCommand(*cmd);
}

}  // namespace cistern::cli
