// Fuzzes the chunk metadata record, chunk key and logged write decoders (bytes
// read from a target's RocksDB and metadata log). Each either fails with
// kCorruption or re-encodes to exactly the input (a version 3 chunk record,
// which gains the chain field when written again: to a record that decodes
// to the same).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "storage/chunk_meta.h"

using namespace cistern;
using namespace cistern::storage;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto m = decodeChunkMeta(in);
  if (m.ok()) {
    const std::string again = encodeChunkMeta(*m);
    if (size == kChunkMetaBytes3) {
      auto back = decodeChunkMeta(again);
      if (!back.ok() || !(*back == *m) || back->chain != 0) std::abort();
    } else if (again != in) {
      std::abort();
    }
    if (m->length > classBytes(m->size_class)) std::abort();
  } else if (m.code() != ErrorCode::kCorruption) {
    std::abort();
  }
  auto w = decodeLoggedWrite(in);
  if (w.ok()) {
    if (encodeLoggedWrite(*w) != in) std::abort();
    if (w->data_offset + w->data.size() > classBytes(w->size_class)) std::abort();
  } else if (w.code() != ErrorCode::kCorruption) {
    std::abort();
  }
  auto k = decodeChunkKey(in);
  if (k.ok() && encodeChunkKey(*k) != in) std::abort();
  return 0;
}
