#include "kv/key_codec.h"

namespace cistern::kv {
namespace {
constexpr uint8_t kTypeBytes = 0x01;
constexpr uint8_t kTypeU64 = 0x15;

Status decodeError(std::string_view what) { return Status(ErrorCode::kKeyDecode, what); }
}  // namespace

std::string_view prefixName(Prefix p) {
  switch (p) {
#define CISTERN_X(name, value, desc) \
  case Prefix::name:                 \
    return #name;
    CISTERN_KV_PREFIXES(CISTERN_X)
#undef CISTERN_X
  }
  return "kUnknownPrefix";
}

KeyWriter& KeyWriter::u64(uint64_t v) {
  key_.push_back(static_cast<char>(kTypeU64));
  for (int shift = 56; shift >= 0; shift -= 8)
    key_.push_back(static_cast<char>((v >> shift) & 0xff));
  return *this;
}

KeyWriter& KeyWriter::bytes(std::string_view s) {
  key_.push_back(static_cast<char>(kTypeBytes));
  for (char c : s) {
    key_.push_back(c);
    if (c == '\0') key_.push_back(static_cast<char>(0xff));
  }
  key_.push_back('\0');
  return *this;
}

Result<Prefix> KeyReader::prefix() {
  if (rest_.empty()) return decodeError("missing prefix");
  auto p = static_cast<Prefix>(static_cast<uint8_t>(rest_[0]));
  if (prefixName(p) == "kUnknownPrefix") return decodeError("unknown prefix");
  rest_.remove_prefix(1);
  return p;
}

Result<uint64_t> KeyReader::u64() {
  if (rest_.size() < 9 || static_cast<uint8_t>(rest_[0]) != kTypeU64) {
    return decodeError("expected u64 component");
  }
  uint64_t v = 0;
  for (int i = 1; i <= 8; ++i) v = (v << 8) | static_cast<uint8_t>(rest_[i]);
  rest_.remove_prefix(9);
  return v;
}

Result<std::string> KeyReader::bytes() {
  if (rest_.empty() || static_cast<uint8_t>(rest_[0]) != kTypeBytes) {
    return decodeError("expected bytes component");
  }
  std::string out;
  size_t i = 1;
  while (true) {
    if (i >= rest_.size()) return decodeError("unterminated bytes component");
    char c = rest_[i];
    if (c != '\0') {
      out.push_back(c);
      ++i;
      continue;
    }
    // 0x00 0xFF is an escaped NUL; a lone 0x00 ends the component.
    if (i + 1 < rest_.size() && static_cast<uint8_t>(rest_[i + 1]) == 0xff) {
      out.push_back('\0');
      i += 2;
      continue;
    }
    rest_.remove_prefix(i + 1);
    return out;
  }
}

std::string strinc(std::string_view prefix) {
  std::string s(prefix);
  while (!s.empty() && static_cast<uint8_t>(s.back()) == 0xff) s.pop_back();
  if (!s.empty()) s.back() = static_cast<char>(static_cast<uint8_t>(s.back()) + 1);
  return s;
}

}  // namespace cistern::kv
