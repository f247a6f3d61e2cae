// A checkpoint's manifest (docs/checkpoint_format.md, "Manifest"): JSON
// naming every tensor's data file, offset, size, CRC32C and per-block
// hashes. Pure functions over bytes; the engine (checkpoint.h) reads and
// writes the file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/safetensors.h"
#include "common/result.h"

namespace cistern::ckpt {

// One tensor as a manifest records it.
struct ManifestTensor {
  std::string name;
  std::string in;    // the sibling checkpoint whose directory holds `file`; empty: this one
  std::string file;  // a data file's name in that directory
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  uint64_t offset = 0;  // of the tensor's first byte in the file
  uint64_t bytes = 0;
  // Compressed ("zstd", "lz4": one frame of `stored` bytes at `offset`
  // that decompresses to `bytes`), or not ("": stored == bytes).
  std::string codec;
  uint64_t stored = 0;
  uint32_t crc32c = 0;
  std::vector<std::string> blocks;  // XXH3-128 of each block_bytes piece, 32 hex digits
};

struct Manifest {
  uint32_t version = 1;
  int64_t created_ns = 0;
  uint64_t block_bytes = 4ull << 20;
  std::string base;  // the checkpoint whose tensors it reused (empty: none)
  std::map<std::string, std::string> metadata;
  std::vector<ManifestTensor> tensors;  // sorted by name
  const ManifestTensor* find(std::string_view name) const;
};

// The largest hash block a manifest may name.
inline constexpr uint64_t kBlockBytesMax = 1ull << 30;

std::string encodeManifest(const Manifest& m);
// kCorruption naming the problem for anything but a manifest encodeManifest
// could have written (fuzzed: tests/fuzz/ckpt_manifest_fuzz.cc).
Result<Manifest> decodeManifest(std::string_view json);

// A name a manifest may hold for a file or a checkpoint: one path
// component, not "." or "..".
bool plainName(std::string_view s);

}  // namespace cistern::ckpt
