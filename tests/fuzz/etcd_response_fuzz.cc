// Fuzzes the parsers of etcd's answers (kv/etcd_client.h) and base64: any
// bytes parse or fail with an error, never crash; decoded base64 encodes
// back to the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/base64.h"
#include "kv/etcd_client.h"

using namespace cistern;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  (void)kv::etcd::parseRange(in);
  (void)kv::etcd::parseTxn(in);
  (void)kv::etcd::parseLease(in);
  (void)kv::etcd::errorOf(in);
  if (auto bytes = base64Decode(in)) {
    if (base64Encode(*bytes) != in) std::abort();
  }
  return 0;
}
