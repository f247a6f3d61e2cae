// Fuzzes the KV key decoder. Any bytes either fail to decode with an error or
// decode into components whose re-encoding is exactly the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kv/key_codec.h"

using namespace cistern::kv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  KeyReader r(in);
  auto prefix = r.prefix();
  if (!prefix.ok()) return 0;
  KeyWriter w(*prefix);
  while (!r.done()) {
    KeyReader probe = r;
    if (auto u = probe.u64(); u.ok()) {
      r = probe;
      w.u64(*u);
      continue;
    }
    probe = r;
    if (auto b = probe.bytes(); b.ok()) {
      r = probe;
      w.bytes(*b);
      continue;
    }
    return 0;  // malformed tail: rejected, fine
  }
  if (w.key() != in) std::abort();
  return 0;
}
