// Tokens and capabilities (docs/security.md): who a caller is and what it
// may do, signed with HMAC-SHA256 by one of the cluster's keys, checked
// without any lookup.
//
// A token names a tenant, the uid/gid its calls act as, its rights and its
// expiry; a capability (granted by meta at open) names one inode, rights
// over its chunks and a short expiry. Both have the same text form:
//
//   cst1.<base64 body>.<base64 mac>
//
// body, little-endian, in this order (every field always present):
//   u8  kind (1 token, 2 capability)    u32 key id
//   u64 id (random: revocation names it) i64 issued, i64 expires (unix s)
//   u32 uid   u32 gid   u32 rights       u64 inode (capabilities; else 0)
//   u8  tenant length (1-64), the tenant's bytes ([a-z0-9._-])
// mac = HMAC-SHA256(key, "cistern-token-v1" || body), key = the keyring's
// key of that id. A body of any other length, kind, tenant or field value
// is refused before the MAC is checked.
//
// Keyring: at most two live keys (rotation: add the new one second, move
// it first once every signer has it, drop the old one once every token it
// signed has expired). The first signs; either verifies.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace cistern::auth {

enum class Kind : uint8_t { kToken = 1, kCapability = 2 };

// Rights: bits.
inline constexpr uint32_t kRead = 1;
inline constexpr uint32_t kWrite = 2;
inline constexpr uint32_t kAdmin = 4;  // tenants, quotas, tokens
inline constexpr uint32_t kAllRights = kRead | kWrite | kAdmin;

// The tenant of the cluster's own operators: its tokens are not confined to
// a subtree (and, with kAdmin, keep root); `cistern tenant create` refuses it.
inline constexpr std::string_view kClusterTenant = "cluster";

struct Token {
  Kind kind = Kind::kToken;
  uint32_t key_id = 0;  // set by Keyring::sign
  uint64_t id = 0;      // random if 0 at signing
  int64_t issued_unix_s = 0;
  int64_t expires_unix_s = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t rights = 0;
  uint64_t inode = 0;  // capabilities
  std::string tenant;
};

// "rw", "r", "rwa", ...: kInvalidArgument naming the bad letter.
Result<uint32_t> parseRights(std::string_view text);
std::string rightsText(uint32_t rights);
// kInvalidArgument unless 1-64 of [a-z0-9._-].
Status checkTenantName(std::string_view tenant);

// The body's bytes and back (no MAC; the parse is the one a verifier runs
// on untrusted text: kTokenInvalid naming what is wrong).
std::string encodeBody(const Token& t);
Result<Token> decodeBody(std::string_view body);

// The label a refusal of `code` is counted under in the services'
// *_auth_refusals_total{reason} (missing, invalid, expired, revoked,
// wrong_tenant, read_only, not_admin, capability; other for any other code).
const char* refusalReason(ErrorCode code);

// What a token's text says, unverified (a client reading its own token or
// capability: who it is, when it expires). Never a basis for trust.
Result<Token> peek(std::string_view text);

class Keyring {
 public:
  static constexpr size_t kKeyBytes = 32;
  struct Key {
    uint32_t id = 0;
    std::array<uint8_t, kKeyBytes> secret{};
  };

  // Lines "ID HEX" (HEX: 64 hex digits), '#' comments and blank lines; one
  // or two keys, distinct ids. kConfigInvalid naming the line.
  static Result<Keyring> parse(std::string_view text);
  // The same, from a file (which must not be readable by group or others).
  static Result<Keyring> load(const std::string& path);
  // A line for a key file: a fresh random key of id `id`.
  static std::string generateLine(uint32_t id);

  // The token's text, signed with the first key (its key id set, its id
  // made random if 0). kInvalidArgument for a token a verifier would refuse.
  Result<std::string> sign(Token t) const;
  // The token in `text` if its MAC is right under the key it names, it has
  // not expired at `now_unix_s` and its id is not in `revoked`. Errors:
  // kTokenMissing (empty text), kTokenInvalid (malformed, unknown key,
  // wrong MAC: forged), kTokenExpired, kTokenRevoked; each names why.
  Result<Token> verify(std::string_view text, int64_t now_unix_s,
                       const std::set<uint64_t>* revoked = nullptr) const;

  const std::vector<Key>& keys() const { return keys_; }

 private:
  std::vector<Key> keys_;  // [0] signs
};

// A server's own credential for its calls to other servers: a token of the
// cluster tenant with every right, signed afresh once less than a quarter
// of its `ttl_s` is left. Thread-safe.
class ServiceCredential {
 public:
  explicit ServiceCredential(Keyring keyring, int64_t ttl_s = 86400);
  std::string get();

 private:
  const Keyring keyring_;
  const int64_t ttl_s_;
  std::mutex mu_;
  std::string text_;
  int64_t expires_ = 0;
};

}  // namespace cistern::auth
