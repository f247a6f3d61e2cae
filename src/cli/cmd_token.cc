// `cistern token keygen|issue|inspect` (auth/token.h, docs/security.md):
// a key line for a cluster's key file, a signed token for a tenant, and
// what a token says (and whether the keys verify it). Revocation is the
// cluster's (it keeps the list); these commands need no cluster.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <ctime>

#include "auth/token.h"
#include "cli/commands.h"

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
}

}  // namespace cistern::cli
