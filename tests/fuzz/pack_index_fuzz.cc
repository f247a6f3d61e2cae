// Fuzzes the pack format's decoders (bytes read from a pack's index and
// shard files, docs/pack_format.md): each either fails with kCorruption or
// gives what re-encodes to the input's meaningful bytes; and the functions
// over sample names (WebDataset keys, directory prefixes).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "pack/pack_format.h"

using namespace cistern;
using namespace cistern::pack;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto h = decodeIndexHeader(in);
  if (h.ok()) {
    if (encodeIndexHeader(*h).substr(0, 80) != in.substr(0, 80)) std::abort();
    if (h->fileBytes() < h->bloomOffset()) std::abort();
  } else if (h.code() != ErrorCode::kCorruption) {
    std::abort();
  }
  auto s = decodeShardHeader(in);
  if (s.ok()) {
    if (encodeShardHeader(*s).substr(0, 28) != in.substr(0, 28)) std::abort();
  } else if (s.code() != ErrorCode::kCorruption) {
    std::abort();
  }
  auto e = decodeEntry(in);
  if (e.ok() && encodeEntry(*e) != in) std::abort();
  if (!e.ok() && size == kEntryBytes) std::abort();
  if (auto g = indexGeneration(in); g && indexGeneration(indexName(*g)) != g) std::abort();
  // Names from an index: WebDataset's split gives back the name; directory
  // prefixes are prefixes ending in '/'.
  if (auto w = webdatasetName(in)) {
    if (std::string(w->key) + "." + std::string(w->field) != in) std::abort();
  }
  const std::string_view prev = in.substr(0, size / 2), name = in.substr(size / 2);
  for (std::string_view d : newDirPrefixes(prev, name)) {
    if (d.empty() || d.back() != '/' || name.substr(0, d.size()) != d || prev.starts_with(d))
      std::abort();
  }
  if (size >= 8 && size % 8 == 0) {
    auto b = Bloom::fromBytes(in, size * 8, 7);
    if (!b.ok() || b->bytes() != in) std::abort();
  }
  return 0;
}
