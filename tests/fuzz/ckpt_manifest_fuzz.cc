// Fuzzes the checkpoint manifest decoder (docs/checkpoint_format.md,
// "Manifest"): it either refuses with kCorruption or gives a manifest that
// encodes to one decoding to the same tensors.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ckpt/manifest.h"

using namespace cistern;
using namespace cistern::ckpt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto m = decodeManifest(in);
  if (!m.ok()) {
    if (m.code() != ErrorCode::kCorruption) std::abort();
    return 0;
  }
  for (const ManifestTensor& t : m->tensors) {
    if (!plainName(t.file) || !(t.in.empty() || plainName(t.in))) std::abort();
    if (t.blocks.size() != (t.bytes + m->block_bytes - 1) / m->block_bytes) std::abort();
  }
  auto again = decodeManifest(encodeManifest(*m));
  if (!again.ok() || again->tensors.size() != m->tensors.size() || again->metadata != m->metadata ||
      again->created_ns != m->created_ns)
    std::abort();
  for (size_t i = 0; i < m->tensors.size(); ++i) {
    const ManifestTensor &a = m->tensors[i], &b = again->tensors[i];
    if (a.name != b.name || a.file != b.file || a.in != b.in || a.offset != b.offset ||
        a.bytes != b.bytes || a.crc32c != b.crc32c || a.blocks != b.blocks || a.shape != b.shape ||
        a.codec != b.codec || a.stored != b.stored)
      std::abort();
  }
  return 0;
}
