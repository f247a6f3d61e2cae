// Fuzzes the safetensors header decoder (bytes read from a checkpoint's
// data files, docs/checkpoint_format.md): it either refuses with
// kCorruption or gives tensors that cover the buffer exactly and that
// encode to a header which decodes to the same tensors.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ckpt/safetensors.h"

using namespace cistern;
using namespace cistern::ckpt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto n = decodeHeaderLength(in, size);
  if (!n.ok() && n.code() != ErrorCode::kCorruption) std::abort();
  if (n.ok() && (*n > size - 8 || *n > kHeaderBytesMax)) std::abort();
  // The data size: taken from the input's first byte so that both covering
  // and not covering buffers come up.
  const uint64_t data_bytes = size > 0 ? static_cast<uint8_t>(in[0]) * 4u : 0;
  auto h = decodeHeader(in, data_bytes);
  if (!h.ok()) {
    if (h.code() != ErrorCode::kCorruption) std::abort();
    return 0;
  }
  uint64_t at = 0;
  for (const TensorInfo& t : h->tensors) {
    if (t.begin != at || t.expectedBytes() != t.end - t.begin) std::abort();
    at = t.end;
  }
  if (at != data_bytes) std::abort();
  Header again = *h;
  auto bytes = encodeHeader(&again);
  if (!bytes.ok()) return 0;  // e.g. a name the writer refuses
  auto back = decodeHeader(std::string_view(*bytes).substr(8), again.dataBytes());
  if (!back.ok() || back->tensors.size() != h->tensors.size() || back->metadata != h->metadata)
    std::abort();
  return 0;
}
