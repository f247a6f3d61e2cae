// Tokens and capabilities (token.h).
#include "auth/token.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <ctime>
#include <fstream>
#include <sstream>

#include "common/assert.h"
#include "common/base64.h"
#include "common/endian.h"

namespace cistern::auth {
namespace {

constexpr std::string_view kPrefix = "cst1.";
constexpr std::string_view kDomain = "cistern-token-v1";
constexpr size_t kTenantMax = 64;
// kind, key id, id, issued, expires, uid, gid, rights, inode, tenant length.
constexpr size_t kFixedBytes = 1 + 4 + 8 + 8 + 8 + 4 + 4 + 4 + 8 + 1;
constexpr size_t kMacBytes = 32;
// Text longer than this is no token (the longest possible is well below).
constexpr size_t kTextMax = 512;

Status invalid(const std::string& why) {
  return Status(ErrorCode::kTokenInvalid, "token refused: " + why);
}

std::array<uint8_t, kMacBytes> mac(const Keyring::Key& key, std::string_view body) {
  std::string input(kDomain);
  input.append(body);
  std::array<uint8_t, kMacBytes> out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.secret.data(), static_cast<int>(key.secret.size()),
       reinterpret_cast<const unsigned char*>(input.data()), input.size(), out.data(), &len);
  return out;
}

std::optional<int> hexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return std::nullopt;
}

}  // namespace

Result<uint32_t> parseRights(std::string_view text) {
  uint32_t r = 0;
  for (char c : text) {
    switch (c) {
      case 'r':
        r |= kRead;
        break;
      case 'w':
        r |= kWrite;
        break;
      case 'a':
        r |= kAdmin;
        break;
      default:
        return Status(
            ErrorCode::kInvalidArgument,
            fmt::format("rights '{}': '{}' is none of r (read), w (write), a (admin)", text, c));
    }
  }
  if (r == 0) return Status(ErrorCode::kInvalidArgument, "rights: empty (give r, w and/or a)");
  return r;
}

std::string rightsText(uint32_t rights) {
  std::string out;
  if (rights & kRead) out += 'r';
  if (rights & kWrite) out += 'w';
  if (rights & kAdmin) out += 'a';
  return out.empty() ? "-" : out;
}

Status checkTenantName(std::string_view tenant) {
  if (tenant.empty() || tenant.size() > kTenantMax)
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("tenant name of {} bytes (1-{})", tenant.size(), kTenantMax));
  for (char c : tenant) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok)
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("tenant name '{}': only a-z, 0-9, '.', '_' and '-'", tenant));
  }
  return Status::OK();
}

std::string encodeBody(const Token& t) {
  std::string b;
  b.reserve(kFixedBytes + t.tenant.size());
  appendLE<uint8_t>(b, static_cast<uint8_t>(t.kind));
  appendLE<uint32_t>(b, t.key_id);
  appendLE<uint64_t>(b, t.id);
  appendLE<int64_t>(b, t.issued_unix_s);
  appendLE<int64_t>(b, t.expires_unix_s);
  appendLE<uint32_t>(b, t.uid);
  appendLE<uint32_t>(b, t.gid);
  appendLE<uint32_t>(b, t.rights);
  appendLE<uint64_t>(b, t.inode);
  appendLE<uint8_t>(b, static_cast<uint8_t>(t.tenant.size()));
  b += t.tenant;
  return b;
}

Result<Token> decodeBody(std::string_view b) {
  if (b.size() < kFixedBytes)
    return invalid(fmt::format("body of {} bytes (at least {})", b.size(), kFixedBytes));
  // Fields in order; the size check above covers every fixed one.
  size_t at = 0;
  auto take = [&]<typename T>(T* out) {
    *out = getLE<T>(b, at);
    at += sizeof(T);
  };
  Token t;
  uint8_t kind = 0, tenant_len = 0;
  take(&kind);
  take(&t.key_id);
  take(&t.id);
  take(&t.issued_unix_s);
  take(&t.expires_unix_s);
  take(&t.uid);
  take(&t.gid);
  take(&t.rights);
  take(&t.inode);
  take(&tenant_len);
  if (kind != static_cast<uint8_t>(Kind::kToken) && kind != static_cast<uint8_t>(Kind::kCapability))
    return invalid(fmt::format("kind {}", kind));
  t.kind = static_cast<Kind>(kind);
  if (b.size() != at + tenant_len)
    return invalid(fmt::format("body of {} bytes for a tenant of {}", b.size(), tenant_len));
  t.tenant.assign(b.substr(at, tenant_len));
  if (Status s = checkTenantName(t.tenant); !s.ok()) return invalid(std::string(s.message()));
  if (t.rights == 0 || (t.rights & ~kAllRights) != 0)
    return invalid(fmt::format("rights {:#x}", t.rights));
  if (t.expires_unix_s <= t.issued_unix_s) return invalid("expires before it was issued");
  if ((t.kind == Kind::kCapability) != (t.inode != 0))
    return invalid("a capability names an inode, a token none");
  return t;
}

Result<Keyring> Keyring::parse(std::string_view text) {
  Keyring k;
  std::istringstream in{std::string(text)};
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::string id_text, hex, extra;
    if (!(fields >> id_text)) continue;  // blank
    auto bad = [&](const std::string& why) {
      return Status(ErrorCode::kConfigInvalid, fmt::format("key line {}: {}", n, why));
    };
    if (!(fields >> hex) || (fields >> extra))
      return bad("want 'ID HEX' (an id and 64 hex digits)");
    Key key;
    try {
      size_t used = 0;
      const unsigned long id = std::stoul(id_text, &used);
      if (used != id_text.size() || id == 0 || id > UINT32_MAX) throw std::out_of_range("id");
      key.id = static_cast<uint32_t>(id);
    } catch (const std::exception&) {
      return bad(fmt::format("id '{}' is not a number in 1-{}", id_text, UINT32_MAX));
    }
    if (hex.size() != 2 * kKeyBytes)
      return bad(fmt::format("key of {} hex digits (want {})", hex.size(), 2 * kKeyBytes));
    for (size_t i = 0; i < kKeyBytes; ++i) {
      auto hi = hexDigit(hex[2 * i]), lo = hexDigit(hex[2 * i + 1]);
      if (!hi || !lo) return bad("the key is not hex");
      key.secret[i] = static_cast<uint8_t>(*hi << 4 | *lo);
    }
    for (const Key& other : k.keys_)
      if (other.id == key.id) return bad(fmt::format("key id {} twice", key.id));
    if (k.keys_.size() == 2) return bad("a third key (two live keys at most: rotate, then drop)");
    k.keys_.push_back(key);
  }
  if (k.keys_.empty()) return Status(ErrorCode::kConfigInvalid, "no key (lines 'ID HEX')");
  return k;
}

Result<Keyring> Keyring::load(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return Status(ErrorCode::kConfigInvalid, fmt::format("key file {}: {}", path, strerror(errno)));
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    return Status(ErrorCode::kConfigInvalid,
                  fmt::format("key file {} is readable by others (mode {:o}): chmod 600 it", path,
                              st.st_mode & 0777));
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  auto k = parse(text.str());
  if (!k.ok()) return k.status().withContext("key file " + path);
  return k;
}

std::string Keyring::generateLine(uint32_t id) {
  std::array<uint8_t, kKeyBytes> secret{};
  if (RAND_bytes(secret.data(), static_cast<int>(secret.size())) != 1) std::abort();
  std::string hex;
  for (uint8_t b : secret) hex += fmt::format("{:02x}", b);
  OPENSSL_cleanse(secret.data(), secret.size());
  return fmt::format("{} {}", id, hex);
}

Result<std::string> Keyring::sign(Token t) const {
  t.key_id = keys_.at(0).id;
  if (t.id == 0) {
    while (t.id == 0)
      if (RAND_bytes(reinterpret_cast<unsigned char*>(&t.id), sizeof t.id) != 1)
        return Status(ErrorCode::kInternal, "no random bytes for a token id");
  }
  const std::string body = encodeBody(t);
  if (auto back = decodeBody(body); !back.ok())
    return Status(ErrorCode::kInvalidArgument, back.status().message());
  const auto m = mac(keys_[0], body);
  return std::string(kPrefix) + base64Encode(body) + "." +
         base64Encode(std::string_view(reinterpret_cast<const char*>(m.data()), m.size()));
}

namespace {

struct Split {
  std::string body;
  std::string mac;
};

// The body and MAC of a token's text, checked for shape only.
Result<Split> split(std::string_view text) {
  if (text.empty()) return Status(ErrorCode::kTokenMissing, "no token given");
  if (text.size() > kTextMax) return invalid(fmt::format("{} bytes of text", text.size()));
  if (text.substr(0, kPrefix.size()) != kPrefix) return invalid("not a cistern token (cst1.)");
  text.remove_prefix(kPrefix.size());
  const size_t dot = text.find('.');
  if (dot == std::string_view::npos) return invalid("no MAC");
  auto body = base64Decode(text.substr(0, dot));
  auto mac = base64Decode(text.substr(dot + 1));
  if (!body || !mac) return invalid("not base64");
  if (mac->size() != kMacBytes) return invalid("a MAC of the wrong size");
  return Split{std::move(*body), std::move(*mac)};
}

}  // namespace

const char* refusalReason(ErrorCode code) {
  switch (code) {
    case ErrorCode::kTokenMissing:
      return "missing";
    case ErrorCode::kTokenInvalid:
      return "invalid";
    case ErrorCode::kTokenExpired:
      return "expired";
    case ErrorCode::kTokenRevoked:
      return "revoked";
    case ErrorCode::kWrongTenant:
      return "wrong_tenant";
    case ErrorCode::kTokenReadOnly:
      return "read_only";
    case ErrorCode::kTokenNotAdmin:
      return "not_admin";
    case ErrorCode::kCapabilityRefused:
      return "capability";
    default:
      return "other";
  }
}

Result<Token> peek(std::string_view text) {
  ASSIGN_OR_RETURN(Split parts, split(text));
  return decodeBody(parts.body);
}

Result<Token> Keyring::verify(std::string_view text, int64_t now_unix_s,
                              const std::set<uint64_t>* revoked) const {
  ASSIGN_OR_RETURN(Split parts, split(text));
  const std::string& body = parts.body;
  const std::string& given = parts.mac;
  ASSIGN_OR_RETURN(Token t, decodeBody(body));
  const Key* key = nullptr;
  for (const Key& k : keys_)
    if (k.id == t.key_id) key = &k;
  if (!key) return invalid(fmt::format("signed with key {}, which this keyring lacks", t.key_id));
  const auto want = mac(*key, body);
  if (CRYPTO_memcmp(want.data(), given.data(), kMacBytes) != 0)
    return invalid("its MAC is wrong (forged, or signed with another key of that id)");
  if (now_unix_s >= t.expires_unix_s)
    return Status(ErrorCode::kTokenExpired,
                  fmt::format("token {:016x} of tenant {} expired {} s ago", t.id, t.tenant,
                              now_unix_s - t.expires_unix_s));
  if (revoked && revoked->count(t.id))
    return Status(ErrorCode::kTokenRevoked,
                  fmt::format("token {:016x} of tenant {} was revoked", t.id, t.tenant));
  return t;
}

ServiceCredential::ServiceCredential(Keyring keyring, int64_t ttl_s)
    : keyring_(std::move(keyring)), ttl_s_(ttl_s) {}

std::string ServiceCredential::get() {
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  std::lock_guard lock(mu_);
  if (text_.empty() || expires_ - now < ttl_s_ / 4) {
    Token t;
    t.tenant = std::string(kClusterTenant);
    t.rights = kAllRights;
    t.issued_unix_s = now;
    t.expires_unix_s = now + ttl_s_;
    auto signed_text = keyring_.sign(t);
    CISTERN_CHECK(signed_text.ok(), signed_text.status().toString());
    text_ = std::move(signed_text).value();
    expires_ = t.expires_unix_s;
  }
  return text_;
}

}  // namespace cistern::auth
