// Fuzzes the commit log's record and batch decoders (bytes read back from a
// log segment after a crash). Each either fails with kCorruption or
// re-encodes to exactly the bytes it consumed.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kv/commit_log.h"

using namespace cistern;
using namespace cistern::kv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto r = decodeLogRecord(in);
  if (r.ok()) {
    if (r->bytes > in.size() || r->last < r->first) std::abort();
    if (encodeLogRecord(r->epoch, r->first, r->last, r->payload) != in.substr(0, r->bytes))
      std::abort();
  } else if (r.code() != ErrorCode::kCorruption) {
    std::abort();
  }
  auto b = decodeLogBatch(in);
  if (b.ok()) {
    if (encodeLogBatch(*b) != in) std::abort();
  } else if (b.code() != ErrorCode::kCorruption) {
    std::abort();
  }
  return 0;
}
