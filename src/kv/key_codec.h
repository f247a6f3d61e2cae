// Order-preserving key encoding.
//
// A key is a prefix byte (prefixes.h) followed by typed components. The
// encoding keeps order: comparing two encoded keys bytewise gives the order of
// their component tuples, so a range scan over (parent, *) lists a directory.
//
//   component   encoding
//   uint64      0x15, 8 bytes big-endian
//   bytes       0x01, the bytes with 0x00 escaped as 0x00 0xFF, then 0x00
//
// KeyReader decodes and rejects any malformed input with kKeyDecode, never
// reading out of bounds (it is fuzzed: tests/fuzz/key_codec_fuzz.cc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/result.h"
#include "kv/prefixes.h"

namespace cistern::kv {

class KeyWriter {
 public:
  explicit KeyWriter(Prefix p) { key_.push_back(static_cast<char>(p)); }
  KeyWriter& u64(uint64_t v);
  KeyWriter& bytes(std::string_view s);
  const std::string& key() const& { return key_; }
  std::string key() && { return std::move(key_); }

 private:
  std::string key_;
};

class KeyReader {
 public:
  explicit KeyReader(std::string_view key) : rest_(key) {}
  Result<Prefix> prefix();
  Result<uint64_t> u64();
  Result<std::string> bytes();
  bool done() const { return rest_.empty(); }

 private:
  std::string_view rest_;
};

// The smallest key greater than every key that starts with `prefix`
// (for range ends); empty if no such key exists (prefix is all 0xFF).
std::string strinc(std::string_view prefix);

}  // namespace cistern::kv
